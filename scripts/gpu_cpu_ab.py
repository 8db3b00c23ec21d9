"""CPU expert kernel builds A/B'd in one process, interleaved (a shared host's bandwidth
drifts by ±20% within minutes: builds measured one after the other can't be compared).

Each build is the best variant this CPU runs (`amx` on the GPU machine; if its build fails
the script stops rather than time a fallback) compiled with one set of the
kernel's tuning macros (`EDGEMOE_CPU_DEFINES`, e.g. "EM_QPAGES=0"; "" is the default).
Each round times every build (× `--threads` counts × `--gemm-min-tokens` thresholds: the
fewest tokens a job takes the blocked path with) on the same cases — `--experts` a call
(a layer's 8 and one by default) at each of `--tokens` (one by default; from the kernel's
threshold on the blocked path: 8 on AMX, int8 12, else 16), per weight format — in turn; the figure is each build's median over rounds
of its rate relative to the round's first build: the C calls' rate (what the engine's CPU
share runs), the entry point's beside it. Writes $OUT/cpu-ab.json.

    OUT=... PYTHONPATH=src python3 scripts/gpu_cpu_ab.py --builds "EM_QPAGES=0" "" --rounds 12 [--tokens 1 32]
    OUT=... PYTHONPATH=src python3 scripts/gpu_cpu_ab.py --builds "" --gemm-min-tokens 16 2 --tokens 4 8 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from edgemoe.bench.bandwidth import LAYER_EXPERTS, expert_pool, expert_rate, quant_expert_rate, quant_pool
from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_kernel import GEMM_MIN_TOKENS, CpuExperts, best_variant_strictly


def kernel_for(variant: str, defines: str, threads: int | None, gemm_min_tokens: int) -> CpuExperts:
    """A CpuExperts running `variant` built with `defines` on `threads` (its own library and
    pool), jobs of `gemm_min_tokens` tokens or more on the blocked path."""
    return CpuExperts(variant, threads=threads, lib=cpu_build.load_tuned(variant, defines),
                      gemm_min_tokens=gemm_min_tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", nargs="+", default=["EM_QPAGES=0", ""])
    ap.add_argument("--weights", nargs="+", default=["bf16", "int8", "fp8"])
    ap.add_argument("--threads", type=int, nargs="+", default=[0], help="each build on each count (0: physical cores)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1], help="tokens a call (from the threshold on: the blocked path)")
    ap.add_argument("--experts", type=int, nargs="+", default=[LAYER_EXPERTS, 1], help="experts a call")
    ap.add_argument("--gemm-min-tokens", type=int, nargs="+", default=[GEMM_MIN_TOKENS],
                    help="each build at each threshold: jobs of this many tokens or more take the blocked path")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=0.15, help="per case, build and round")
    args = ap.parse_args()
    variant = best_variant_strictly()
    setups = [(d, t, g) for d in args.builds for t in args.threads for g in args.gemm_min_tokens]
    kernels = [kernel_for(variant, d, t or None, g) for d, t, g in setups]
    labels = [f"{d} x{k.threads}" + (f" gemm>={g}" if len(args.gemm_min_tokens) > 1 else "")
              for (d, _, g), k in zip(setups, kernels, strict=True)]
    print(f"{variant}, {cpu_isa.physical_cores()} physical cores, os.cpu_count() {os.cpu_count()}, setups {labels}", flush=True)
    pools = {w: expert_pool(1 << 30, 2048, 768) if w == "bf16" else quant_pool(w, 1 << 30, 2048, 768) for w in args.weights}
    cases = [(w, n, t) for w in args.weights for t in args.tokens for n in args.experts]
    rates: dict[tuple[str, int, int], list[list[float]]] = {c: [[] for _ in kernels] for c in cases}
    entry: dict[tuple[str, int, int], list[list[float]]] = {c: [[] for _ in kernels] for c in cases}
    for r in range(args.rounds):
        for case in cases:
            w, n, t = case
            for b, kernel in enumerate(kernels):
                time.sleep(0.005)  # the other pools' workers stop spinning
                if w == "bf16":
                    rate = expert_rate(kernel, pools[w], t, n, args.seconds)
                else:
                    rate = quant_expert_rate(kernel, w, pools[w], t, n, args.seconds)
                rates[case][b].append(rate.get("kernel_gb_s", rate["gb_s"]))
                entry[case][b].append(rate["gb_s"])
        print(f"round {r + 1}/{args.rounds}", flush=True)
    rows = []
    for (w, n, t), per_build in rates.items():
        for b, vals in enumerate(per_build):
            rel = [v / base for v, base in zip(vals, per_build[0], strict=True)]
            rows.append({"weights": w, "experts_per_call": n, "tokens": t, "build": labels[b],
                         "gb_s_median": round(statistics.median(vals), 1),
                         "entry_gb_s_median": round(statistics.median(entry[(w, n, t)][b]), 1),
                         "vs_first_median": round(statistics.median(rel), 3),
                         "vs_first_quartiles": [round(q, 3) for q in statistics.quantiles(rel, n=4)]})
            print(f"  {w:5s} {n}×n={t:<3d} {labels[b]!r:45s} {rows[-1]['gb_s_median']:6.1f} GB/s "
                  f"(entry {rows[-1]['entry_gb_s_median']:5.1f})  "
                  f"×{rows[-1]['vs_first_median']:.3f} {rows[-1]['vs_first_quartiles']}", flush=True)
    path = os.path.join(os.environ.get("OUT", "bench/results"), "cpu-ab.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"variant": variant, "setups": labels, "rounds": args.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
