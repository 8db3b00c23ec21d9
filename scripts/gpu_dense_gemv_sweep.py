"""Sweep the Triton skinny GEMM (`kernels/triton_ops/dense_gemv.py`) against cuBLAS
(`F.linear`) at Qwen3-30B-A3B's decode projections, bf16, M = 1..32 tokens.

Each case runs inside one CUDA graph, replayed many times and timed with CUDA events,
rotating through copies of the weight so the working set exceeds L2 (a decode step reads
each weight from HBM once). Every configuration is checked against cuBLAS first (a bad
tile is reported, not timed). Prints a table, the best configuration overall (the
geometric mean of its speed-up over cuBLAS across all cases) and per shape; writes
JSON to $OUT/dense_gemv_sweep.json (else bench/results/dense-gemv-sweep-<time>.json).

Run from the repository root on the GPU machine:
  PYTHONPATH=/tmp/site:src python3 scripts/gpu_dense_gemv_sweep.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from edgemoe.bench.cuda_timing import graph_us
from edgemoe.kernels.triton_ops.dense_gemv import (
    DEFAULT_TILES,
    GemvTiles,
    dense_gemv_triton,
    split_k,
)

SHAPES = {"qkv": (5120, 2048), "o_proj": (2048, 4096), "router": (128, 2048), "lm_head": (151936, 2048)}
TOKENS = (1, 2, 4, 8, 16, 32)
L2_BYTES = 64 << 20  # more than an H200's 50 MB L2: two L2s of weight copies per round
REPLAYS = 20


def configs(quick: bool) -> list[GemvTiles]:
    """The tile configurations swept (the default first)."""
    out = [DEFAULT_TILES]
    grid = [(16, 128, 4, 3), (16, 512, 4, 3), (32, 256, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3),
            (16, 256, 8, 4), (32, 256, 8, 3), (64, 256, 8, 3)]
    for n, k, warps, stages in grid[: 3 if quick else None]:
        out.append(GemvTiles(block_n=n, block_k=k, num_warps=warps, num_stages=stages))
    if not quick:
        out += [GemvTiles(block_m=32), GemvTiles(min_programs=256), GemvTiles(min_programs=64, max_split=8)]
    return out


def weights(n: int, k: int) -> list[torch.Tensor]:
    """Enough copies of a [n, k] bf16 weight to exceed L2 (one when it alone does)."""
    copies = max(1, math.ceil(2 * L2_BYTES / (n * k * 2)))
    return [(torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16) for _ in range(copies)]


def case(name: str, m: int, ws: list[torch.Tensor], tiles: list[GemvTiles]) -> dict:
    """Time cuBLAS and every configuration at one (shape, M)."""
    n, k = ws[0].shape
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    nbytes = n * k * 2 + m * (k + n) * 2
    cublas = graph_us([lambda w=w: F.linear(x, w) for w in ws], replays=REPLAYS)
    row = {"shape": name, "n": n, "k": k, "m": m, "bytes": nbytes,
           "cublas_us": cublas, "cublas_gbs": nbytes / cublas / 1e3, "triton": {}}
    want = F.linear(x, ws[0]).float()
    for t in tiles:
        got = dense_gemv_triton(x, ws[0], t).float()
        # both are fp32 sums rounded to bf16: a few bf16 ulps of the largest output apart
        if not torch.allclose(got, want, rtol=2**-6, atol=2**-6 * want.abs().max().item()):
            row["triton"][t.label()] = {"error": "mismatch against cuBLAS"}
            continue
        us = graph_us([lambda w=w, t=t: dense_gemv_triton(x, w, t) for w in ws], replays=REPLAYS)
        row["triton"][t.label()] = {"us": us, "gbs": nbytes / us / 1e3, "split": split_k(n, k, t)[0],
                                    "speedup": cublas / us}
    return row


def best(rows: list[dict], shape: str | None = None) -> tuple[str, float]:
    """The configuration with the highest geometric-mean speed-up over cuBLAS."""
    logs: dict[str, list[float]] = {}
    for row in rows:
        if shape is not None and row["shape"] != shape:
            continue
        for label, r in row["triton"].items():
            logs.setdefault(label, []).append(math.log(r["speedup"]) if "us" in r else -math.inf)
    scores = {label: math.exp(sum(v) / len(v)) for label, v in logs.items()}
    label = max(scores, key=scores.__getitem__)
    return label, scores[label]


def report(rows: list[dict]) -> dict:
    """Print the per-case table and the best configurations; the JSON summary."""
    print(f"{'shape':8} {'M':>3} {'cuBLAS µs':>10} {'GB/s':>6}  best triton (µs, GB/s, config)")
    for row in rows:
        timed = {k: v for k, v in row["triton"].items() if "us" in v}
        label = min(timed, key=lambda k: timed[k]["us"]) if timed else "-"
        r = timed.get(label, {"us": float("nan"), "gbs": float("nan")})
        print(f"{row['shape']:8} {row['m']:>3} {row['cublas_us']:>10.2f} {row['cublas_gbs']:>6.0f}  "
              f"{r['us']:.2f} µs {r['gbs']:.0f} GB/s {label}")
    overall = best(rows)
    per_shape = {name: best(rows, name) for name in dict.fromkeys(row["shape"] for row in rows)}
    print(f"best overall: {overall[0]} (geomean speed-up over cuBLAS {overall[1]:.2f}x)")
    for name, (label, score) in per_shape.items():
        print(f"  best for {name}: {label} ({score:.2f}x)")
    return {"best": overall, "best_per_shape": per_shape}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 configurations instead of 12")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    args = parser.parse_args()
    tiles = configs(args.quick)
    rows = []
    for name in args.shapes.split(","):
        ws = weights(*SHAPES[name])
        rows += [case(name, m, ws, tiles) for m in TOKENS]
        del ws
        torch.cuda.empty_cache()
    summary = report(rows)
    out_dir = os.environ.get("OUT")
    path = (Path(out_dir) / "dense_gemv_sweep.json" if out_dir
            else Path("bench/results") / f"dense-gemv-sweep-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    path.write_text(json.dumps({**meta, **summary, "configs": [t.__dict__ for t in tiles], "cases": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
