"""Do the CPU's expert reads and the device's copies of the same experts share the host's
memory reads? (issue 13: the CPU share computes its misses where they lie and admits none
of them to the cache, because a copy of an expert costs a second read of host memory
beside the CPU's; if a copy made while, or just after, the CPU reads the expert were
served from the CPU's last-level cache, admitting the CPU's hot picks would be nearly free.)

A pool of bf16 experts at Qwen3-30B-A3B's shape (pinned, ~1 GB: far beyond any last-level
cache, so a group read for the first time in a while comes from DRAM), groups of `--group`
experts; per scenario, `--reps` rounds over fresh groups, medians of:
- cpu: the C kernel's call on group A alone (one token, the share's decode call);
- copy: the device copies group A alone (host → device, one stream);
- both_diff / both_same: the copy of group B (another) / of A (the same) started, then the
  CPU's call on A: the CPU's time and the two's wall time;
- after_load_fresh / after_load_read: the CPU reads A; then, while the device copies B (not
  read lately) / A (just read), the CPU computes group C: the CPU's time on C. If the
  copy of what the CPU just read comes from its cache, C runs as fast as with no copy.
Writes $OUT/shared-read-<time>.json.

    OUT=/tmp PYTHONPATH=src python3 scripts/gpu_shared_read.py [--group 3] [--reps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from edgemoe.bench.bandwidth import expert_bytes, expert_call, expert_pool
from edgemoe.kernels.cpu_kernel import default_cpu_experts

H, I = 2048, 768
EXPERT_BYTES = expert_bytes(H, I)


def pinned_pool(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` experts of `bench bw`'s pool (pages unique), page-locked for the copies."""
    gate_up, down = expert_pool(count * EXPERT_BYTES, H, I)
    return gate_up.pin_memory(), down.pin_memory()


class Copier:
    """Host → device copies of a group's experts on a stream of their own."""

    def __init__(self, banks: tuple[torch.Tensor, torch.Tensor], group: int) -> None:
        self.banks, self.group = banks, group
        self.dst = (torch.empty((group, 2 * I, H), dtype=torch.bfloat16, device="cuda"),
                    torch.empty((group, H, I), dtype=torch.bfloat16, device="cuda"))
        self.stream = torch.cuda.Stream()
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def launch(self, g: int) -> None:
        count = self.banks[0].shape[0]
        with torch.cuda.stream(self.stream):
            self.start.record()
            for j in range(self.group):
                e = (g * self.group + j) % count
                self.dst[0][j].copy_(self.banks[0][e], non_blocking=True)
                self.dst[1][j].copy_(self.banks[1][e], non_blocking=True)
            self.end.record()

    def wait_us(self) -> float:
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3


def clock(fn) -> float:  # noqa: ANN001
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--pool", type=int, default=108, help="experts in the pool (a multiple of the group)")
    args = ap.parse_args()
    banks = pinned_pool(args.pool)
    kernel = default_cpu_experts()
    call = expert_call(kernel, banks, tokens=1, per_call=args.group, tables_ahead=True)
    copier = Copier(banks, args.group)
    groups = args.pool // args.group
    for g in range(groups):  # warm: every page touched once, the kernel's pool up
        call(g)
    copier.launch(0)
    copier.wait_us()
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    g = 0
    for _ in range(args.reps):
        a, b, c = g % groups, (g + groups // 3) % groups, (g + 2 * groups // 3) % groups
        g += 1
        add("cpu_us", clock(lambda: call(a)))  # noqa: B023
        a, b, c = [(x + 1) % groups for x in (a, b, c)]
        copier.launch(a)
        add("copy_us", copier.wait_us())
        a, b, c = [(x + 1) % groups for x in (a, b, c)]
        for name, target in (("both_diff", b), ("both_same", a)):
            t0 = time.perf_counter()
            copier.launch(target)
            add(f"{name}_cpu_us", clock(lambda: call(a)))  # noqa: B023
            add(f"{name}_copy_us", copier.wait_us())
            add(f"{name}_wall_us", (time.perf_counter() - t0) * 1e6)
            a, b, c = [(x + 2) % groups for x in (a, b, c)]
        for name, target in (("after_load_fresh", "b"), ("after_load_read", "a")):
            call(a)  # the CPU reads A
            copier.launch(a if target == "a" else b)
            add(f"{name}_cpu_us", clock(lambda: call(c)))  # noqa: B023
            add(f"{name}_copy_us", copier.wait_us())
            a, b, c = [(x + 2) % groups for x in (a, b, c)]
    result = {"group": args.group, "reps": args.reps, "pool_experts": args.pool, "expert_bytes": EXPERT_BYTES,
              "threads": kernel.threads, "kernel": kernel.name,
              "medians": {k: statistics.median(v) for k, v in rows.items()}}
    gb = args.group * EXPERT_BYTES / 1e3
    for key, us in result["medians"].items():
        print(f"{key:26s} {us:9.1f} µs  ({gb / us:6.1f} GB/s of one group's bytes)")
    out = os.environ.get("OUT", ".")
    path = os.path.join(out, f"shared-read-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
