"""Fused MoE for few tokens (decode): weight streaming per routed (token, k) pair.

At batch 1 the step is pure weight bandwidth (Qwen3-30B-A3B: 8 experts x 9.4 MB per
layer), so the grid splits each pair's output rows into many programs, each streaming
its rows of the slot's bank with wide loads along H. Launch 1: gate and up rows →
act(gate) * up into the workspace [T*K, I] (in the activation dtype); launch 2: down
rows → the pair's fp32 cell. Rounding points follow the torch reference
(`moe_experts_partial_ref`): each projection's output, the activation and the product
are rounded to the activation dtype.

NOTE: tile sizes are constants (never derived from T): a pair's cell depends only on
its token's x, its slot and its weight (batch invariance).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import ACT_CODES
from edgemoe.kernels.triton_ops.moe_common import (
    gemv_chunk,
    moe_launch,
    store_cell_rows,
    store_gated_rows,
    tile_range,
)

# Output rows per program and reduction width per step: 16 x 128 bf16 rows = 4 KiB per
# matrix per step, I=768 / 16 = 48 programs per pair for gate_up, H=2048 / 16 = 128 for
# down. The fastest of 8 configurations swept on an H200 at T = 1 and 8
# (bench/results/decode-tuning-20261201-140100.json: 30.1 µs vs 34.3 for 16 x 256).
GU_ROWS, GU_COLS, GU_WARPS = 16, 128, 4
DOWN_ROWS, DOWN_COLS, DOWN_WARPS = 16, 128, 4


def tiles() -> tuple[int, int, int, int, int, int]:
    """The tile constants; `EDGEMOE_MOE_GEMV_TILES="gu_rows,gu_cols,gu_warps,down_rows,
    down_cols,down_warps"` overrides them for tuning sweeps (scripts/gpu_decode_tuning.py)."""
    override = os.environ.get("EDGEMOE_MOE_GEMV_TILES")
    if override:
        return tuple(int(v) for v in override.split(","))  # type: ignore[return-value]
    return GU_ROWS, GU_COLS, GU_WARPS, DOWN_ROWS, DOWN_COLS, DOWN_WARPS


@triton.jit
def _gate_up_gemv(
    x_ptr, slot_ptr, gu_ptr, inter_ptr,
    H, I, K, stride_xt, stride_gs, stride_gr, stride_it,
    ACT: tl.constexpr, DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, INTERP: tl.constexpr,
):
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    t = pair // K
    rows, row_ok = tile_range(1, ROWS, I)
    bank = gu_ptr + slot.to(tl.int64) * stride_gs
    acc_g = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for h0 in range(0, H, COLS):
        cols, xv, ok = gemv_chunk(x_ptr, t, stride_xt, h0, H, row_ok, COLS)
        g = tl.load(bank + rows[:, None] * stride_gr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        u = tl.load(bank + (rows + I)[:, None] * stride_gr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc_g += g * xv[None, :]
        acc_u += u * xv[None, :]
    store_gated_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u, ACT, DTYPE, INTERP)


@triton.jit
def _down_gemv(
    inter_ptr, slot_ptr, w_ptr, down_ptr, cells_ptr,
    H, I, K, stride_it, stride_ds, stride_dr, stride_ct, stride_ck,
    DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, INTERP: tl.constexpr,
):
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows, row_ok = tile_range(1, ROWS, H)
    bank = down_ptr + slot.to(tl.int64) * stride_ds
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for i0 in range(0, I, COLS):
        cols, a, ok = gemv_chunk(inter_ptr, pair, stride_it, i0, I, row_ok, COLS)
        d = tl.load(bank + rows[:, None] * stride_dr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += d * a[None, :]
    store_cell_rows(cells_ptr, w_ptr, acc, pair, rows, row_ok, K, stride_ct, stride_ck, DTYPE, INTERP)


def moe_decode_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str, workspace: torch.Tensor | None = None,
) -> None:
    run = moe_launch(x, slot_ids, weights, cells, gate_up.shape[1] // 2, workspace)
    if run is None:
        return
    x, H, I, K, pairs, inter = run.x, run.H, run.I, run.K, run.pairs, run.inter
    gate_up, down = gate_up.contiguous(), down.contiguous()
    slots = slot_ids.to(torch.int32).contiguous().view(-1)
    gu_rows, gu_cols, gu_warps, down_rows, down_cols, down_warps = tiles()
    _gate_up_gemv[(pairs, triton.cdiv(I, gu_rows))](
        x, slots, gate_up, inter, H, I, K, x.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        ACT=ACT_CODES[act], DTYPE=run.dtype, ROWS=gu_rows, COLS=gu_cols, INTERP=run.interp, num_warps=gu_warps,
    )
    _down_gemv[(pairs, triton.cdiv(H, down_rows))](
        inter, slots, run.weights, down, cells, H, I, K, inter.stride(0), down.stride(0), down.stride(1),
        cells.stride(0), cells.stride(1),
        DTYPE=run.dtype, ROWS=down_rows, COLS=down_cols, INTERP=run.interp, num_warps=down_warps,
    )
