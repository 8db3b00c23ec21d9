"""Fused MoE decode over quantised slot banks: `moe_gemv.py` with the weight rows
dequantised in registers (`dequant.py`) as they stream.

Same grid and rounding points as the bf16 kernel (launch 1: gate/up rows → act(gate)·up
into the workspace; launch 2: down rows → the pair's fp32 cell): at batch 1 a program
reads each weight byte once, so the step moves the format's bytes, not bf16's. Weights
are dequantised to fp32 and multiplied in fp32 (weight-only: the arithmetic is free
next to the memory reads at few tokens).

No split-K here (moe_gemv.py's `gu_splits` is the bf16 kernel's alone): the quantised
gate/up launch keeps one program per row tile, reducing all of H.

NOTE: tile sizes are constants (never derived from T): batch invariance, as moe_gemv.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import ACT_CODES, fp8_hardware, pdl_start
from edgemoe.kernels.triton_ops.dequant import dequant, format_code
from edgemoe.kernels.triton_ops.moe_common import (
    bank_args,
    gemv_chunk,
    moe_launch,
    slot_banks,
    store_cell_rows,
    store_gated_rows,
    tile_range,
)
from edgemoe.quant import ExpertFormat, Parts

GU_ROWS, GU_COLS, GU_WARPS = 16, 256, 4
DOWN_ROWS, DOWN_COLS, DOWN_WARPS = 16, 256, 4


@triton.jit
def _gate_up_gemv_q(
    x_ptr, slot_ptr, gu_ptr, gus_ptr, guz_ptr, inter_ptr,
    H, I, K, stride_xt, stride_gs, stride_gr, stride_ss, stride_sr, stride_it,
    ACT: tl.constexpr, DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, INTERP: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, FP8HW: tl.constexpr, USE_PDL: tl.constexpr,
):
    pair = tl.program_id(0)
    pdl_start(USE_PDL)  # NOTE: no weight load before it: the slot banks are written in the step
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    t = pair // K
    rows, row_ok = tile_range(1, ROWS, I)
    bank, sbank, zbank = slot_banks(gu_ptr, gus_ptr, guz_ptr, slot, stride_gs, stride_ss)
    acc_g = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for h0 in range(0, H, COLS):
        cols, xv, ok = gemv_chunk(x_ptr, t, stride_xt, h0, H, row_ok, COLS)
        g = dequant(bank, sbank, zbank, rows[:, None], cols[None, :], ok, I, stride_gr, stride_sr, FMT, GROUP,
                    FP8HW)
        u = dequant(bank, sbank, zbank, (rows + I)[:, None], cols[None, :], ok, I, stride_gr, stride_sr, FMT,
                    GROUP, FP8HW)
        acc_g += g * xv[None, :]
        acc_u += u * xv[None, :]
    store_gated_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u, ACT, DTYPE, INTERP)


@triton.jit
def _down_gemv_q(
    inter_ptr, slot_ptr, w_ptr, dn_ptr, dns_ptr, dnz_ptr, cells_ptr,
    H, I, K, stride_it, stride_ds, stride_dr, stride_ss, stride_sr, stride_ct, stride_ck,
    DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, INTERP: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, FP8HW: tl.constexpr, USE_PDL: tl.constexpr,
):
    pair = tl.program_id(0)
    pdl_start(USE_PDL)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows, row_ok = tile_range(1, ROWS, H)
    bank, sbank, zbank = slot_banks(dn_ptr, dns_ptr, dnz_ptr, slot, stride_ds, stride_ss)
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for i0 in range(0, I, COLS):
        cols, a, ok = gemv_chunk(inter_ptr, pair, stride_it, i0, I, row_ok, COLS)
        d = dequant(bank, sbank, zbank, rows[:, None], cols[None, :], ok, H, stride_dr, stride_sr, FMT, GROUP,
                    FP8HW)
        acc += d * a[None, :]
    store_cell_rows(cells_ptr, w_ptr, acc, pair, rows, row_ok, K, stride_ct, stride_ck, DTYPE, INTERP)


def moe_decode_q_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    cells: torch.Tensor, act: str, workspace: torch.Tensor | None = None,
) -> None:
    run = moe_launch(x, slot_ids, weights, cells, parts["gate_up"].shape[1] // 2, workspace)
    if run is None:
        return
    x, H, I, K, pairs, inter = run.x, run.H, run.I, run.K, run.pairs, run.inter
    code, group = format_code(fmt)
    slots = slot_ids.to(torch.int32).contiguous().view(-1)
    pdl = pdl_enabled(x.device)
    gu, gus, guz, *gu_strides = bank_args(parts, "gate_up")
    _gate_up_gemv_q[(pairs, triton.cdiv(I, GU_ROWS))](
        x, slots, gu, gus, guz, inter, H, I, K, x.stride(0), *gu_strides, inter.stride(0),
        ACT=ACT_CODES[act], DTYPE=run.dtype, ROWS=GU_ROWS, COLS=GU_COLS, INTERP=run.interp, FMT=code, GROUP=group,
        FP8HW=fp8_hardware(x), USE_PDL=pdl, launch_pdl=pdl, num_warps=GU_WARPS,
    )
    dn, dns, dnz, *dn_strides = bank_args(parts, "down")
    _down_gemv_q[(pairs, triton.cdiv(H, DOWN_ROWS))](
        inter, slots, run.weights, dn, dns, dnz, cells, H, I, K, inter.stride(0), *dn_strides, cells.stride(0),
        cells.stride(1), DTYPE=run.dtype, ROWS=DOWN_ROWS, COLS=DOWN_COLS, INTERP=run.interp, FMT=code, GROUP=group,
        FP8HW=fp8_hardware(x), USE_PDL=pdl, launch_pdl=pdl, num_warps=DOWN_WARPS,
    )
