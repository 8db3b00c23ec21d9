"""The quantised MoE prefill GEMMs (`triton_ops/moe_gemm_q.py`) timed per launch over tile
settings, at a prompt chunk's shape: T tokens x top-K pairs over E resident slots.

2026-12-06's GLM-4.5-Air profile (int4, 1K prompt) had `_gate_up_gemm_q` at 33.8 ms a
layer against `_down_gemm_q`'s 3.4 for twice the weights: this says which settings fix it.
Each setting's output is checked against the first setting's before it is timed; a
setting's gate/up four apply to both launches of int4 / mxfp4 (`PACKED_TILES`). JSON to
$OUT/prefill_q_sweep.json.

    PYTHONPATH=/tmp/site:src python3 scripts/gpu_prefill_q_sweep.py [--shapes 4096,1408 2048,768] [--formats int4 fp8]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton

from edgemoe.kernels.triton_ops import moe_gemm_q as mq
from edgemoe.quant import expert_format
from edgemoe.quant.formats import quantise_expert

SETTINGS = [  # (GU_N, GU_K, GU_WARPS, GU_STAGES, DOWN_N, DOWN_K, DOWN_WARPS, DOWN_STAGES)
    (64, 64, 4, 3, 64, 64, 4, 3),  # the defaults (int4 / mxfp4: before 2026-12-06)
    (64, 32, 8, 3, 64, 32, 8, 3),  # PACKED_TILES since: int4 x5.8, mxfp4 x3.5 at GLM's shape
    (64, 64, 8, 3, 64, 64, 8, 3),
    (64, 64, 8, 4, 64, 64, 8, 4),
    (64, 64, 8, 2, 64, 64, 8, 2),
    (32, 64, 8, 3, 64, 64, 8, 3),
    (128, 64, 8, 3, 64, 64, 8, 3),
    (64, 64, 16, 3, 64, 64, 16, 3),
]


def run_case(H: int, I: int, fmt_name: str, T: int, K: int, E: int, rounds: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    fmt = expert_format(fmt_name)
    experts = []
    for _ in range(E):
        gu = torch.randn(2 * I, H, device="cuda", generator=g) * H**-0.5
        experts.append(quantise_expert(fmt, gu[:I], gu[I:], torch.randn(H, I, device="cuda", generator=g) * I**-0.5))
    parts = {name: torch.stack([e[name] for e in experts]) for name in experts[0]}
    x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:K] for _ in range(T)]).int()
    weights = torch.rand(T, K, device="cuda", generator=g)
    rows = []
    ref = None
    for s in SETTINGS:
        mq.GU_N, mq.GU_K, mq.GU_WARPS, mq.GU_STAGES, mq.DOWN_N, mq.DOWN_K, mq.DOWN_WARPS, mq.DOWN_STAGES = s
        mq.PACKED_TILES = s[:4]  # the 4-bit formats' own (both launches take the gate/up four here)
        cells = torch.zeros(T, K, H, device="cuda", dtype=torch.bfloat16)
        try:
            mq.moe_prefill_q_triton(x, ids, weights, parts, fmt, cells, "silu")
        except Exception as e:  # noqa: BLE001 - a setting the compiler refuses
            rows.append({"setting": s, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        if ref is None:
            ref = cells.float()
        err = (cells.float() - ref).abs().max().item()
        ok = err <= 2e-2 * ref.abs().max().item()
        ms = triton.testing.do_bench(lambda: mq.moe_prefill_q_triton(x, ids, weights, parts, fmt, cells, "silu"),
                                     rep=rounds)
        rows.append({"setting": s, "ms": round(ms, 3), "ok": ok, "max_err": err})
        print(f"H={H} I={I} {fmt_name} T={T}: {s} {ms:.3f} ms {'ok' if ok else 'DIFFERS'}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4096,1408", "2048,768"])
    ap.add_argument("--formats", nargs="+", default=["int4", "fp8"])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    out = {}
    for shape in args.shapes:
        H, I = map(int, shape.split(","))
        for f in args.formats:
            out[f"{shape}:{f}"] = run_case(H, I, f, args.tokens, 8, 128, args.rounds)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "prefill_q_sweep.json"), "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
