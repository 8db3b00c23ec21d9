"""Issue 16's benchmark on the GPU machine: random:qwen3.8-flash-next under --gpu-memory 16GiB.

For each configuration (one engine start each): decode tok/s at 32K and 128K context
(batch 1, random prompts), misses per token, the copy bound and the copy + CPU bound from
those misses (offload II's definition, docs/benchmarks.md: min(52.6 + B_cpu, 93.8) GB/s ÷
(misses/token × bytes per expert), B_cpu = 60 GB/s) and the ratio to each, PLE bytes
read per token and the milliseconds per token a disk store's fills held a step, the
device memory peak (the driver's count: context included), and the plan's slots.

    OUT=... PYTHONPATH=/tmp/site:src python3 scripts/gpu_qwen4_bench.py [--contexts 32768 131072]
      [--configs host-embed-device host-embed-host disk-embed-device] [--decode-tokens 32] [--warmup-tokens 192]
      [--alternate-env EDGEMOE_BLOCKING_WAIT=1]

Configurations: `<ple store>-embed-<device|host>[-cpuN|-hybrid][-pf][-float]`; `-cpuN` runs the last N misses of
each MoE layer on the CPU inside the step (`--moe-backend hybrid --cpu-experts-per-layer N`), `-hybrid`
a live quota of them (`--moe-backend hybrid` on the device cache), `-pf` adds `--moe-prefetch on`, `-float`
leaves the CPU pool's workers unpinned (`EDGEMOE_CPU_PIN=0`; pinned one to a core by default). Writes $OUT/qwen4_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

PCIE_GBPS, CPU_GBPS, CEILING_GBPS = 52.6, 60.0, 93.8  # PERF-NOTES / docs/benchmarks.md (issue 13)
MODEL = "random:qwen3.8-flash-next"


def bounds(misses: float, expert_bytes: int) -> tuple[float, float]:
    """(copy bound, copy + CPU bound) in tok/s for `misses` per token."""
    if misses <= 0:
        return float("inf"), float("inf")
    per_token = misses * expert_bytes
    return PCIE_GBPS * 1e9 / per_token, min(PCIE_GBPS + CPU_GBPS, CEILING_GBPS) * 1e9 / per_token


def outside_allocator(rt: Any) -> int:
    """Slot banks mapped outside torch's allocator (lendable: moe/lendable_memory.py)."""
    slots = getattr(rt.executor, "slots", None)
    return getattr(slots, "outside_allocator", 0)


def ple_per_token(llm: Any, store_before: dict[str, float], tokens: int) -> dict[str, float]:
    store = llm.engine.runtime.ple
    if store is None:
        return {}
    g = store.geometry
    gathered = len(g.layers) * g.heads * g.row_nbytes(llm.engine.runtime.model.arch.dtype.itemsize)
    row: dict[str, float] = {"ple_bytes_per_token": gathered, "ple_store": type(store).__name__}
    if hasattr(store, "bytes_read"):  # the disk store: what the filler read, and the steps' waits
        row["ple_disk_bytes_per_token"] = (store.bytes_read - store_before["bytes"]) / max(tokens, 1)
        row["ple_wait_ms_per_token"] = 1000 * (store.wait_seconds - store_before["wait"]) / max(tokens, 1)
    return row


def alternate(setting: str | None, request: int) -> str:
    """Sets `setting` ("VAR=value") in the environment for even-numbered requests (1-based)
    and removes it for the others; returns what the request runs with ("" for nothing)."""
    if not setting:
        return ""
    var, sep, value = setting.partition("=")
    if not sep or not var:
        raise SystemExit(f"--alternate-env {setting!r}: expected VAR=value")
    if request % 2 == 0:
        os.environ[var] = value
        return setting
    os.environ.pop(var, None)
    return ""


def step_spread(r: dict[str, Any]) -> dict[str, float]:
    """The steady steps' fastest, median and slowest milliseconds (the rate's steps: the
    first left out, `bench.decode.steady_rate`; a slow request shows in all three)."""
    steady = r["decode_step_ms_each"][-r["decode_steps"] + 1:] or r["decode_step_ms_each"]
    return {"step_ms_min": min(steady), "step_ms_p50": r["decode_step_ms_p50"], "step_ms_max": r["decode_step_ms_max"]}


def host_summary(host: dict[str, float], tokens: int) -> dict[str, float]:
    """A slow request's suspects in three numbers (bench/host_counters.py): this process's
    involuntary context switches a token, the machine's steal share, the kernel's page scans."""
    if not host:
        return {}
    scans = sum(v for k, v in host.items() if k.startswith(("vm_pgscan_", "vm_compact_migrate")))
    return {"involuntary_switches_per_token": host.get("ctx_switches_involuntary", 0) / max(tokens, 1),
            "steal_share": host.get("cpu_steal_share", 0.0), "idle_share": host.get("cpu_idle_share", 0.0),
            "vm_scanned_pages": scans}


def quota(llm: Any) -> dict[str, Any]:
    """The live CPU quota now and as settled (in `cpu_quota_unit`: the share of each layer's
    misses, or CPU experts a layer), when the run has one."""
    moe = llm.stats()["moe"]
    return {k: moe[k] for k in ("cpu_quota_unit", "cpu_quota_per_layer", "cpu_quota_settled") if k in moe}


def run_config(
    name: str, contexts: list[int], decode_tokens: int, warmup_tokens: int, profile_steps: int = 0,
    alternate_env: str | None = None,
) -> list[dict[str, Any]]:
    from edgemoe import LLM
    from edgemoe.bench.decode import measure
    from edgemoe.engine.budget import expert_nbytes

    ple, embed = name.split("-embed-")
    embed, *extras = embed.split("-")
    share: dict[str, Any] = {}
    for extra in extras:
        if extra.startswith("cpu"):  # a fixed count of each layer's misses on the CPU
            share |= dict(moe_backend="hybrid", expert_cache="device", cpu_experts_per_layer=int(extra[3:]))
        elif extra == "hybrid":  # the live quota (moe/quota_controller.py)
            share |= dict(moe_backend="hybrid", expert_cache="device")
        elif extra == "pf":
            share |= dict(moe_prefetch="on")
        elif extra != "float":  # float: the C pool's workers unpinned (kernels/cpu_pinning.py)
            raise SystemExit(f"{name}: unknown configuration part {extra!r} (cpuN, hybrid, pf, float)")
    os.environ.pop("EDGEMOE_CPU_PIN", None)  # read when the engine's pool starts
    if "float" in extras:
        os.environ["EDGEMOE_CPU_PIN"] = "0"
    settings = dict(model=MODEL, gpu_memory="16GiB", ple_store=ple, embed_weights=embed, **share,
                    max_model_len=max(contexts) + 2 * decode_tokens + 64, max_running_requests=4,
                    kv_tokens=max(contexts) + 2 * decode_tokens + 64, ple_dir="/tmp/edgemoe-ple")
    rows = []
    t0 = time.perf_counter()
    with LLM(progress=False, **settings) as llm:
        load_s = time.perf_counter() - t0
        rt = llm.engine.runtime
        e_bytes = expert_nbytes(rt.model.arch)
        print(f"{name}: built in {load_s:.1f} s; {rt.plan.num_slots} slots; plan:\n{rt.plan.table()}", flush=True)
        # Warm-up: a live quota (`-hybrid`) starts at one expert a layer and climbs a window
        # of steps at a time; from a start far from its best (~5 of this model's ~9 misses a
        # layer) it needs ~100+ steps, so short timed runs would measure its search.
        measure(llm, 64, 1, warmup_tokens, seed=0)
        for seed, ctx in enumerate(contexts, start=1):
            env = alternate(alternate_env, seed)
            torch.cuda.reset_peak_memory_stats()
            store = rt.ple
            before = {"bytes": getattr(store, "bytes_read", 0), "wait": getattr(store, "wait_seconds", 0.0)}
            r = measure(llm, ctx, 1, decode_tokens, seed=seed, profile_steps=profile_steps)
            misses = r["decode_moe"]["misses_per_token"]
            copy_b, both_b = bounds(misses, e_bytes)
            free, total = torch.cuda.mem_get_info()
            rows.append({
                "config": name, "context": ctx, "env": env, "decode_tok_s": r["decode_tok_s"], "prefill_tok_s": r["prefill_tok_s"],
                "misses_per_token": misses, "hit_rate": r["decode_moe"]["hit_rate"],
                "copy_bound_tok_s": copy_b, "copy_cpu_bound_tok_s": both_b,
                "ratio_to_copy_bound": r["decode_tok_s"] / copy_b, "ratio_to_copy_cpu_bound": r["decode_tok_s"] / both_b,
                "device_peak_gib": (rt.plan.context + torch.cuda.max_memory_reserved() + outside_allocator(rt)) / 2**30,
                "device_in_use_gib": (total - free) / 2**30, "slots": rt.plan.num_slots, "load_s": load_s,
                "cpu_ms_per_token": r["decode_moe"].get("cpu_ms_per_token"), **step_spread(r),
                **host_summary(r.get("decode_host", {}), r["decode_tokens_timed"]),
                "busy_threads": r.get("decode_busy_threads", []),
                "cpu_pinned_workers": llm.stats()["moe"].get("cpu_pinned_workers", 0),
                **ple_per_token(llm, before, r["decode_tokens_timed"]), **quota(llm), "raw": r,
            })
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "raw"}), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--configs", nargs="+", default=["host-embed-device", "host-embed-host", "disk-embed-device"])
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--warmup-tokens", type=int, default=192, help="decode tokens of the untimed first request")
    ap.add_argument("--alternate-env", metavar="VAR=value",
                    help="set for the 2nd, 4th, ... context's request and unset for the others: an A/B of a "
                         "setting read at each step (EDGEMOE_BLOCKING_WAIT) inside one engine")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="decode steps profiled after each context's timed ones (the step's host regions)")
    args = ap.parse_args()
    rows = []
    out = Path(os.environ.get("OUT", "bench/results"))
    out.mkdir(parents=True, exist_ok=True)
    for name in args.configs:
        rows += run_config(name, args.contexts, args.decode_tokens, args.warmup_tokens, args.profile_steps,
                           args.alternate_env)
        # after each configuration: a stage cut by its time limit keeps what it measured
        (out / "qwen4_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"\n{'config':<20} {'ctx':>7} {'tok/s':>7} {'miss/tok':>8} {'vs copy':>8} {'vs copy+cpu':>11} "
          f"{'PLE B/tok':>9} {'wait ms':>7} {'CPU ms/tok':>10} {'invol/tok':>9} {'peak GiB':>8} {'slots':>5}  env")
    for r in rows:
        print(f"{r['config']:<20} {r['context']:>7} {r['decode_tok_s']:7.1f} {r['misses_per_token']:8.1f} "
              f"{r['ratio_to_copy_bound']:8.2f} {r['ratio_to_copy_cpu_bound']:11.2f} {r.get('ple_bytes_per_token', 0):9.0f} "
              f"{r.get('ple_wait_ms_per_token', 0):7.2f} {r['cpu_ms_per_token'] or 0:10.2f} "
              f"{r.get('involuntary_switches_per_token', 0):9.2f} {r['device_peak_gib']:8.2f} {r['slots']:>5}  {r['env']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
