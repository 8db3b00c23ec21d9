"""Decode prefetch's side gather swept in one engine: issue 13's scenario (`random:qwen3-30b-a3b`,
`--gpu-memory 16GiB --kv-tokens 8192`, synthetic routing: the oracle predictor), batch 1, a 1K
prompt. Per setting — prefetch off, or on with a gather grid (programs, block, warps) — the
decode graph is re-captured and `--decode-tokens` tokens are timed; off runs first and last
(drift). Writes $OUT/prefetch-sweep-<backend>-<dtype>.json.

    OUT=... PYTHONPATH=/tmp/site:src python3 scripts/gpu_prefetch_sweep.py --backend hybrid \\
        --grids 32,2048,4 32,8192,8 64,4096,4
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch

from edgemoe import LLM
from edgemoe.bench.decode import measure
from edgemoe.kernels.gather_grid import GatherGrid

DEFAULT_GRIDS = ["32,2048,4", "32,4096,4", "32,8192,4", "32,8192,8", "16,8192,8", "64,2048,4", "64,8192,8",
                 "32,16384,8"]


def recapture(llm) -> None:  # noqa: ANN001
    """The decode graph again, with the executor's current prefetch settings."""
    runner = llm.engine.runner
    runner.graphs = None
    gc.collect()
    runner.capture_graphs()
    llm.engine.runtime.executor.stats.reset()


def run(llm, label: str, seed: int, tokens: int) -> dict:  # noqa: ANN001
    row = measure(llm, 1024, 1, tokens, seed=seed)
    moe = row["decode_moe"]
    out = {"setting": label, "decode_tok_s": round(row["decode_tok_s"], 2),
           "step_ms_p50": round(row["decode_step_ms_p50"], 2), "hit_rate": round(moe["hit_rate"], 3),
           "misses_per_token": round(moe["misses_per_token"], 1),
           **{k: moe[k] for k in ("prefetch_recall", "prefetch_precision") if k in moe}}
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="hybrid", choices=["offload", "hybrid"])
    ap.add_argument("--expert-dtype", default="bf16")
    ap.add_argument("--grids", nargs="+", default=DEFAULT_GRIDS, help="programs,block,warps each")
    ap.add_argument("--decode-tokens", type=int, default=160)
    args = ap.parse_args()
    settings = dict(model="random:qwen3-30b-a3b", dtype="bfloat16", gpu_memory="16GiB", kv_tokens=8192,
                    moe_backend=args.backend, expert_dtype=args.expert_dtype, routing="synthetic",
                    moe_prefetch="on", cuda_graph_max_bs=1)  # one graph: quick re-captures
    rows = []
    t0 = time.perf_counter()
    with LLM(progress=False, **settings) as llm:
        print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
        executor = llm.engine.runtime.executor
        prefetch = executor.prefetch
        measure(llm, 16, 1, 4, seed=0)  # warm-up
        plan = [("off", None)] + [(g, GatherGrid(*(int(v) for v in g.split(",")))) for g in args.grids] + [("off", None)]
        for seed, (label, grid) in enumerate(plan, start=1):
            executor.prefetch = None if grid is None else prefetch
            if grid is not None:
                prefetch.grid = grid
            recapture(llm)
            try:
                rows.append(run(llm, label, seed, args.decode_tokens))
            except Exception as e:  # noqa: BLE001 - one setting's failure (a tile Triton refuses) is a row
                rows.append({"setting": label, "error": repr(e)[:300]})
                print(rows[-1], flush=True)
                torch.cuda.synchronize()
    path = os.path.join(os.environ.get("OUT", "bench/results"), f"prefetch-sweep-{args.backend}-{args.expert_dtype}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"settings": settings, "predictor": "synthetic oracle", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
