"""Where a CPU expert call's time goes: the kernel built with EM_PHASE_TIMES=1
(`kernels/cpu/em_ptimes.h`) records, per thread, its entry into the call and, per phase
(0 pack, 1 gate_up, 2 down), when its own tasks ran out and when the phase's last task
was done. Per weight format, the medians over calls of:
- `entry_last_us`: the latest thread's entry (a worker woken late);
- `pack_us`, `gate_up_us`, `down_us`: each phase's span (previous phase done → this one
  done) and `gate_up_gb_s`, `down_gb_s`: the projection's bytes over it;
- `gate_up_tail_us`, `down_tail_us`: the first thread out of tasks → the phase done (the
  slowest task's lag: lanes' imbalance, a descheduled thread);
- `call_us`: the kernel's whole call, `wall_us`: the Python call around it;
- `qconv_us`, `qtiles_us`: summed over the threads, the time the quantised blocked
  tasks spent converting their rows to bf16 and in their tiles (0 on the GEMV path and
  for bf16 weights); `qconv_share` of the two.
Tells a slow inner loop (a phase's rate) from hand-off and imbalance (entry, tails) — an
A/B of whole calls (`scripts/gpu_cpu_ab.py`) can't. Writes
$OUT/cpu-phase-times-spin<µs>-<time>.json (a file a run: several runs in one call keep theirs).

    OUT=/tmp PYTHONPATH=src python3 scripts/cpu_phase_times.py [--weights bf16 int8 fp8] [--experts 8 1] [--spin-us N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import time

from edgemoe.bench.bandwidth import expert_call, expert_pool, quant_expert_call, quant_pool
from edgemoe.kernels import cpu_build
from edgemoe.kernels.cpu_kernel import CpuExperts, best_variant_strictly
from edgemoe.quant import expert_format, expert_specs

MARKS = 9  # entry; per phase: own tasks done, phase done; the blocked tasks' conversion, tiles ns
MAX_THREADS = 128
H, I = 2048, 768  # Qwen3-30B-A3B's expert


def projection_bytes(weights: str, hidden: int, inter: int) -> tuple[int, int]:
    """(gate_up, down) bytes of one expert in `weights`, scales and zero points included."""
    if weights == "bf16":
        return 2 * inter * hidden * 2, hidden * inter * 2
    specs = expert_specs(expert_format(weights), hidden, inter)
    size = {name: dt.itemsize * math.prod(shape) for name, (shape, dt) in specs.items()}
    return (sum(v for k, v in size.items() if k.startswith("gate_up")),
            sum(v for k, v in size.items() if k.startswith("down")))


def call_marks(lib: ctypes.CDLL, buf: ctypes.Array) -> list[list[int]]:
    n = min(lib.em_phase_times(buf, MAX_THREADS), MAX_THREADS)
    return [list(buf[t * MARKS:(t + 1) * MARKS]) for t in range(n)]


def summarise(marks: list[list[int]], wall_ns: float, nbytes: tuple[int, int]) -> dict[str, float]:
    col = lambda k: [m[k] for m in marks]  # noqa: E731
    done = [max(col(2)), max(col(4)), max(col(6))]
    span = [done[0], done[1] - done[0], done[2] - done[1]]
    conv, tiles = sum(col(7)), sum(col(8))
    return {"qconv_us": conv / 1e3, "qtiles_us": tiles / 1e3, "qconv_share": conv / max(conv + tiles, 1),
            "threads": len(marks), "entry_last_us": max(col(0)) / 1e3, "pack_us": span[0] / 1e3,
            "gate_up_us": span[1] / 1e3, "down_us": span[2] / 1e3,
            "gate_up_gb_s": nbytes[0] / max(span[1], 1), "down_gb_s": nbytes[1] / max(span[2], 1),
            "gate_up_tail_us": (done[1] - min(col(3))) / 1e3, "down_tail_us": (done[2] - min(col(5))) / 1e3,
            "call_us": done[2] / 1e3, "wall_us": wall_ns / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", nargs="+", default=["bf16", "int8", "fp8"])
    ap.add_argument("--experts", type=int, nargs="+", default=[8, 1], help="experts a call")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--gemm-min-tokens", type=int, default=None,
                    help="the blocked path's threshold (default: the kernel's; 1: every call blocked)")
    ap.add_argument("--threads", type=int, default=0, help="0: physical cores")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--defines", default="", help="more tuning macros for the build, e.g. EM_LANES=0")
    ap.add_argument("--spin-us", type=int, default=None, help="the pool's idle spin (default: the engine's)")
    args = ap.parse_args()
    variant = best_variant_strictly()
    lib = cpu_build.load_tuned(variant, f"EM_PHASE_TIMES=1 {args.defines}".strip())
    kernel = CpuExperts(variant, threads=args.threads or None, spin_us=args.spin_us, lib=lib,
                        gemm_min_tokens=args.gemm_min_tokens)
    buf = (ctypes.c_long * (MARKS * MAX_THREADS))()
    rows = []
    for w in args.weights:
        pool = expert_pool(1 << 30, H, I) if w == "bf16" else quant_pool(w, 1 << 30, H, I)
        for n in args.experts:
            call = expert_call(kernel, pool, args.tokens, n) if w == "bf16" else \
                quant_expert_call(kernel, w, pool, args.tokens, n)
            per_expert = projection_bytes(w, H, I)
            nbytes = (n * per_expert[0], n * per_expert[1])
            call(0)
            stats = []
            for i in range(1, args.calls + 1):
                t = time.perf_counter_ns()
                call(i)
                wall = time.perf_counter_ns() - t
                stats.append(summarise(call_marks(lib, buf), wall, nbytes))
            row = {"weights": w, "experts_per_call": n, "tokens": args.tokens, "variant": variant,
                   "threads_in_pool": kernel.threads, "defines": args.defines, "spin_us": kernel.spin_us,
                   **{k: round(statistics.median(s[k] for s in stats), 2) for k in stats[0]}}
            row["call_gb_s"] = round(sum(nbytes) / (row["call_us"] * 1e3), 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(os.environ.get("OUT", "bench/results"), f"cpu-phase-times-spin{kernel.spin_us}-{stamp}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
