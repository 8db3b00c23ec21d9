"""Sweep the dense decode GEMV (`kernels/triton_ops/dense_gemv.py`) against cuBLAS
(`F.linear`) at Qwen3-30B-A3B's decode projections, bf16, M = 1..32 tokens, in one run of
well under a minute on an H200.

Each case runs inside one CUDA graph, replayed and timed with CUDA events, rotating
through copies of the weight so the working set exceeds L2 (a decode step reads each
weight from HBM once). Every tile candidate is checked first, against `F.linear` and for
batch invariance (its row 0 at M equals its M = 1 output, bitwise): a bad candidate is
reported, not timed. Prints per shape and M the winner, the best candidate overall (the
geometric mean of its speed-up over cuBLAS) and the best for a batch-1 step (48 x qkv +
48 x o_proj + the LM head at M = 1), with the `EDGEMOE_DENSE_GEMV_TILES` string that
selects each; writes JSON to $OUT/dense_gemv_sweep.json (else bench/results/).

Run from the repository root on the GPU machine:
  PYTHONPATH=/tmp/site:src python3 scripts/gpu_dense_gemv_sweep.py [--tiles "16,256,4,1;8,512,4,2"]
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
from edgemoe.kernels.dense_gemv_tiles import ENV, DenseGemvTiles, check, rows_for
from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

# (N, K) and how many times a batch-1 step runs it (Qwen3-30B-A3B: 48 layers, one LM head)
SHAPES = {"qkv": (5120, 2048, 48), "o_proj": (2048, 4096, 48), "lm_head": (151936, 2048, 1),
          # GLM-4.7-Flash's latent attention (47 layers; `--shapes mla_a,mla_q_b,mla_o` alone, as the
          # step sums its shapes): q_a and kv_a in one weight (768 + 576 rows), q_b (20 heads x 256),
          # o_proj (20 x 256 values in)
          "mla_a": (1344, 2048, 47), "mla_q_b": (5120, 768, 47), "mla_o": (2048, 5120, 47)}
TOKENS = (1, 2, 4, 8, 16, 32)
L2_BYTES = 64 << 20  # more than an H200's 50 MB L2: two L2s of weight copies per round
REPLAYS = 10
# rows, cols, warps, tokens a block (min_row_tiles 256, 1 stage); registers a thread from
# ptxas -v at sm_90 in brackets (no spills unless said). Without pipelining a program has one
# step's loads in flight, so the grid has N x COLS x 2 bytes in flight: o_proj at 256 columns
# 1 MB, about a third of what an H200's ~4.8 TB/s x ~600 ns needs; wider steps, not more rows,
# raise it (rows_for already gives o_proj 256+ programs). The MoE GEMV's gate/up step, 1 token
# [78]; the default, 2 tokens so M = 32 reads a tile 16 times, not 32 [147]; 8 x 512 at 1 and
# 2 tokens (o_proj 2 MB in flight) [78, 147]; 4 x 1024 at 1 and 2 tokens (4 MB) [64, 138];
# 2 x 1024 at 4 tokens [114]; 4 x 256 at 8 tokens (M = 32: 4 tile reads) [95].
# NOTE (sm_90 SASS, 16 x 256): at 1 token a block ptxas issues 3 of a thread's 4 W loads up
# front, the 4th after the first FMAs; at 2+ tokens the token branches split the step and all
# 4 go out together, for twice the registers: hence both, even for M = 1.
CANDIDATES = "16,256,4,1;16,256,4,2;8,512,4,1;8,512,4,2;4,1024,4,1;4,1024,4,2;2,1024,4,4;4,256,4,8"


def parse(text: str) -> list[DenseGemvTiles]:
    out = []
    for item in filter(None, text.split(";")):
        t = DenseGemvTiles(*map(int, item.split(",")))
        check(t)
        out.append(t)
    return out


def weights(n: int, k: int) -> list[torch.Tensor]:
    """Enough copies of a [n, k] bf16 weight to exceed L2 (one when it alone does)."""
    copies = max(1, math.ceil(2 * L2_BYTES / (n * k * 2)))
    return [(torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16) for _ in range(copies)]


def verify(x: torch.Tensor, w: torch.Tensor, t: DenseGemvTiles) -> str | None:
    """Why the candidate is wrong at this (shape, M), or None."""
    got, want = dense_gemv_triton(x, w, t).float(), F.linear(x, w).float()
    magnitude = x.float().abs() @ w.float().abs().T
    # Two fp32 sums of K terms (γ_K each) rounded once each to bf16 (u = 2^-8 of |y| <= magnitude).
    bound = (2 * x.shape[1] * 2.0**-24 + 2 * 2.0**-8) * magnitude
    if not ((got - want).abs() <= bound).all():
        return "mismatch against F.linear"
    if not torch.equal(dense_gemv_triton(x[:1], w, t)[0], dense_gemv_triton(x, w, t)[0]):
        return "row 0 differs from M = 1 (batch invariance)"
    return None


def case(name: str, m: int, ws: list[torch.Tensor], tiles: list[DenseGemvTiles]) -> dict:
    """Time cuBLAS and every candidate at one (shape, M)."""
    n, k = ws[0].shape
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    nbytes = n * k * 2 + m * (k + n) * 2
    cublas = graph_us([lambda w=w: F.linear(x, w) for w in ws], replays=REPLAYS)
    row = {"shape": name, "n": n, "k": k, "m": m, "bytes": nbytes, "cublas_us": cublas,
           "cublas_gbs": nbytes / cublas / 1e3, "triton": {}}
    for t in tiles:
        error = verify(x, ws[0], t)
        if error:
            row["triton"][t.label()] = {"error": error}
            continue
        us = graph_us([lambda w=w, t=t: dense_gemv_triton(x, w, t) for w in ws], replays=REPLAYS)
        row["triton"][t.label()] = {"us": us, "gbs": nbytes / us / 1e3, "rows": rows_for(n, t), "speedup": cublas / us}
    return row


def geomean_best(rows: list[dict]) -> tuple[str, float]:
    """The candidate with the highest geometric-mean speed-up over cuBLAS (a failure: 0)."""
    logs: dict[str, list[float]] = {}
    for row in rows:
        for label, r in row["triton"].items():
            logs.setdefault(label, []).append(math.log(r["speedup"]) if "us" in r else -math.inf)
    scores = {label: math.exp(sum(v) / len(v)) for label, v in logs.items()}
    label = max(scores, key=scores.__getitem__)
    return label, scores[label]


def step_best(rows: list[dict]) -> tuple[str, float, float]:
    """The candidate with the least dense time in a batch-1 step (µs), and cuBLAS's."""
    ones = [row for row in rows if row["m"] == 1]
    cublas = sum(SHAPES[r["shape"]][2] * r["cublas_us"] for r in ones)
    totals = {label: sum(SHAPES[r["shape"]][2] * r["triton"][label].get("us", math.inf) for r in ones)
              for label in ones[0]["triton"]} if ones else {"-": math.inf}
    label = min(totals, key=totals.__getitem__)
    return label, totals[label], cublas


def report(rows: list[dict]) -> dict:
    """Print the per-case winners and the best candidates; the JSON summary."""
    print(f"{'shape':8} {'M':>3} {'cuBLAS µs':>10} {'GB/s':>6}  winner: µs, GB/s, x cuBLAS, tiles (rows used)")
    for row in rows:
        timed = {k: v for k, v in row["triton"].items() if "us" in v}
        failed = [f"{k}: {v['error']}" for k, v in row["triton"].items() if "error" in v]
        line = f"{row['shape']:8} {row['m']:>3} {row['cublas_us']:>10.2f} {row['cublas_gbs']:>6.0f}  "
        if timed:
            label = min(timed, key=lambda k: timed[k]["us"])
            r = timed[label]
            line += f"{r['us']:.2f} µs {r['gbs']:.0f} GB/s {r['speedup']:.2f}x {label} ({r['rows']})"
        print(line + "".join(f"\n    FAILED {f}" for f in failed))
    overall = geomean_best(rows)
    step = step_best(rows)
    print(f"best overall: {ENV}={overall[0]} (geomean speed-up over cuBLAS {overall[1]:.2f}x)")
    print(f"best batch-1 step: {ENV}={step[0]} ({step[1]:.1f} µs of dense projections a step "
          f"against cuBLAS's {step[2]:.1f})")
    return {"best": overall, "best_step": step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiles", default=CANDIDATES, help="candidates 'rows,cols,warps,tokens[,min_row_tiles"
                        "[,stages]]' separated by ';'")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    args = parser.parse_args()
    tiles = parse(args.tiles)
    start = time.perf_counter()
    rows = []
    for name in args.shapes.split(","):
        n, k, _ = SHAPES[name]
        ws = weights(n, k)
        rows += [case(name, m, ws, tiles) for m in TOKENS]
        del ws
        torch.cuda.empty_cache()
    summary = report(rows)
    print(f"swept in {time.perf_counter() - start:.0f} s")
    out_dir = os.environ.get("OUT")
    path = (Path(out_dir) / "dense_gemv_sweep.json" if out_dir
            else Path("bench/results") / f"dense-gemv-sweep-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    path.write_text(json.dumps({**meta, **summary, "tiles": [t._asdict() for t in tiles], "cases": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
