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

from edgemoe.kernels.triton_ops.common import (
    ACT_CODES,
    activate,
    interpreting,
    round_to,
    round_trip,
    tl_dtype,
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
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < I
    bank = gu_ptr + slot.to(tl.int64) * stride_gs
    acc_g = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for h0 in range(0, H, COLS):
        cols = h0 + tl.arange(0, COLS)
        col_ok = cols < H
        xv = tl.load(x_ptr + t.to(tl.int64) * stride_xt + cols, mask=col_ok, other=0.0).to(tl.float32)
        ok = row_ok[:, None] & col_ok[None, :]
        g = tl.load(bank + rows[:, None] * stride_gr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        u = tl.load(bank + (rows + I)[:, None] * stride_gr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc_g += g * xv[None, :]
        acc_u += u * xv[None, :]
    gate = round_trip(tl.sum(acc_g, axis=1), DTYPE, INTERP)
    up = round_trip(tl.sum(acc_u, axis=1), DTYPE, INTERP)
    h = round_trip(activate(gate, ACT), DTYPE, INTERP) * up
    tl.store(inter_ptr + pair.to(tl.int64) * stride_it + rows, round_to(h, DTYPE, INTERP), mask=row_ok)


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
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < H
    bank = down_ptr + slot.to(tl.int64) * stride_ds
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for i0 in range(0, I, COLS):
        cols = i0 + tl.arange(0, COLS)
        col_ok = cols < I
        a = tl.load(inter_ptr + pair.to(tl.int64) * stride_it + cols, mask=col_ok, other=0.0).to(tl.float32)
        d = tl.load(bank + rows[:, None] * stride_dr + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        acc += d * a[None, :]
    y = round_trip(tl.sum(acc, axis=1), DTYPE, INTERP) * tl.load(w_ptr + pair)
    t = pair // K
    k = pair % K
    tl.store(cells_ptr + t.to(tl.int64) * stride_ct + k * stride_ck + rows, y, mask=row_ok)


def workspace_view(workspace: torch.Tensor | None, pairs: int, inter: int, like: torch.Tensor) -> torch.Tensor:
    """The [pairs, I] intermediate: a view into `workspace` (CUDA graphs keep it static)."""
    if workspace is None:
        return torch.empty(pairs, inter, dtype=like.dtype, device=like.device)
    if workspace.dtype != like.dtype or workspace.numel() < pairs * inter:
        raise ValueError(f"workspace needs {pairs * inter} elements of {like.dtype}")
    return workspace.reshape(-1)[: pairs * inter].view(pairs, inter)


def moe_decode_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str, workspace: torch.Tensor | None = None,
) -> None:
    T, H = x.shape
    K = slot_ids.shape[1]
    I = gate_up.shape[1] // 2
    pairs = T * K
    if pairs == 0:
        return
    if cells.stride(-1) != 1:
        raise ValueError("cells need a unit stride on H (they are written in place)")
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    slots = slot_ids.to(torch.int32).contiguous().view(-1)
    w = weights.to(torch.float32).contiguous().view(-1)
    inter = workspace_view(workspace, pairs, I, x)
    dtype, interp = tl_dtype(x.dtype), interpreting(x)
    gu_rows, gu_cols, gu_warps, down_rows, down_cols, down_warps = tiles()
    _gate_up_gemv[(pairs, triton.cdiv(I, gu_rows))](
        x, slots, gate_up, inter, H, I, K, x.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        ACT=ACT_CODES[act], DTYPE=dtype, ROWS=gu_rows, COLS=gu_cols, INTERP=interp, num_warps=gu_warps,
    )
    _down_gemv[(pairs, triton.cdiv(H, down_rows))](
        inter, slots, w, down, cells, H, I, K, inter.stride(0), down.stride(0), down.stride(1),
        cells.stride(0), cells.stride(1),
        DTYPE=dtype, ROWS=down_rows, COLS=down_cols, INTERP=interp, num_warps=down_warps,
    )
