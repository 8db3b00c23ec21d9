"""Fused MoE decode over quantised slot banks: `moe_gemv.py` with the weight rows
dequantised in registers (`dequant.py`) as they stream.

Same grid and rounding points as the bf16 kernel (launch 1: gate/up rows → act(gate)·up
into the workspace; launch 2: down rows → the pair's fp32 cell): at batch 1 a program
reads each weight byte once, so the step moves the format's bytes, not bf16's. Weights
are dequantised to fp32 and multiplied in fp32 (weight-only: the arithmetic is free
next to the memory reads at few tokens).

NOTE: tile sizes are constants (never derived from T): batch invariance, as moe_gemv.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import (
    ACT_CODES,
    activate,
    fp8_hardware,
    interpreting,
    round_to,
    round_trip,
    tl_dtype,
)
from edgemoe.kernels.triton_ops.dequant import dequant, format_code
from edgemoe.kernels.triton_ops.moe_gemv import workspace_view
from edgemoe.quant import ExpertFormat, Parts

GU_ROWS, GU_COLS, GU_WARPS = 16, 256, 4
DOWN_ROWS, DOWN_COLS, DOWN_WARPS = 16, 256, 4


@triton.jit
def _gate_up_gemv_q(
    x_ptr, slot_ptr, gu_ptr, gus_ptr, guz_ptr, inter_ptr,
    H, I, K, stride_xt, stride_gs, stride_gr, stride_ss, stride_sr, stride_it,
    ACT: tl.constexpr, DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, INTERP: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, FP8HW: tl.constexpr,
):
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    t = pair // K
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < I
    s64 = slot.to(tl.int64)
    bank, sbank, zbank = gu_ptr + s64 * stride_gs, gus_ptr + s64 * stride_ss, guz_ptr + s64 * stride_ss
    acc_g = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for h0 in range(0, H, COLS):
        cols = h0 + tl.arange(0, COLS)
        col_ok = cols < H
        xv = tl.load(x_ptr + t.to(tl.int64) * stride_xt + cols, mask=col_ok, other=0.0).to(tl.float32)
        ok = row_ok[:, None] & col_ok[None, :]
        g = dequant(bank, sbank, zbank, rows[:, None], cols[None, :], ok, I, stride_gr, stride_sr, FMT, GROUP,
                    FP8HW)
        u = dequant(bank, sbank, zbank, (rows + I)[:, None], cols[None, :], ok, I, stride_gr, stride_sr, FMT,
                    GROUP, FP8HW)
        acc_g += g * xv[None, :]
        acc_u += u * xv[None, :]
    gate = round_trip(tl.sum(acc_g, axis=1), DTYPE, INTERP)
    up = round_trip(tl.sum(acc_u, axis=1), DTYPE, INTERP)
    h = round_trip(activate(gate, ACT), DTYPE, INTERP) * up
    tl.store(inter_ptr + pair.to(tl.int64) * stride_it + rows, round_to(h, DTYPE, INTERP), mask=row_ok)


@triton.jit
def _down_gemv_q(
    inter_ptr, slot_ptr, w_ptr, dn_ptr, dns_ptr, dnz_ptr, cells_ptr,
    H, I, K, stride_it, stride_ds, stride_dr, stride_ss, stride_sr, stride_ct, stride_ck,
    DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, INTERP: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, FP8HW: tl.constexpr,
):
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < H
    s64 = slot.to(tl.int64)
    bank, sbank, zbank = dn_ptr + s64 * stride_ds, dns_ptr + s64 * stride_ss, dnz_ptr + s64 * stride_ss
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for i0 in range(0, I, COLS):
        cols = i0 + tl.arange(0, COLS)
        col_ok = cols < I
        a = tl.load(inter_ptr + pair.to(tl.int64) * stride_it + cols, mask=col_ok, other=0.0).to(tl.float32)
        ok = row_ok[:, None] & col_ok[None, :]
        d = dequant(bank, sbank, zbank, rows[:, None], cols[None, :], ok, H, stride_dr, stride_sr, FMT, GROUP,
                    FP8HW)
        acc += d * a[None, :]
    y = round_trip(tl.sum(acc, axis=1), DTYPE, INTERP) * tl.load(w_ptr + pair)
    t = pair // K
    k = pair % K
    tl.store(cells_ptr + t.to(tl.int64) * stride_ct + k * stride_ck + rows, y, mask=row_ok)


def bank_args(parts: Parts, proj: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, int]:
    """(data, scale, zero, data slot stride, data row stride, scale slot stride, scale row
    stride) of one projection's banks; formats without zero points pass the scale twice.
    NOTE: e4m3 data goes in as its bytes: sm_80/86 Triton has no e4m3 pointer type."""
    data, scale = parts[proj].contiguous(), parts[proj + "_scale"].contiguous()
    if data.dtype == torch.float8_e4m3fn:
        data = data.view(torch.uint8)
    zero = parts.get(proj + "_zero", scale).contiguous()
    if zero.stride() != scale.stride():
        raise ValueError(f"{proj}_zero must have the layout of {proj}_scale")
    return data, scale, zero, data.stride(0), data.stride(1), scale.stride(0), scale.stride(1)


def moe_decode_q_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    cells: torch.Tensor, act: str, workspace: torch.Tensor | None = None,
) -> None:
    T, H = x.shape
    K = slot_ids.shape[1]
    I = parts["gate_up"].shape[1] // 2
    pairs = T * K
    if pairs == 0:
        return
    if cells.stride(-1) != 1:
        raise ValueError("cells need a unit stride on H (they are written in place)")
    code, group = format_code(fmt)
    x = x.contiguous()
    slots = slot_ids.to(torch.int32).contiguous().view(-1)
    w = weights.to(torch.float32).contiguous().view(-1)
    inter = workspace_view(workspace, pairs, I, x)
    dtype, interp = tl_dtype(x.dtype), interpreting(x)
    gu, gus, guz, *gu_strides = bank_args(parts, "gate_up")
    _gate_up_gemv_q[(pairs, triton.cdiv(I, GU_ROWS))](
        x, slots, gu, gus, guz, inter, H, I, K, x.stride(0), *gu_strides, inter.stride(0),
        ACT=ACT_CODES[act], DTYPE=dtype, ROWS=GU_ROWS, COLS=GU_COLS, INTERP=interp, FMT=code, GROUP=group,
        FP8HW=fp8_hardware(x), num_warps=GU_WARPS,
    )
    dn, dns, dnz, *dn_strides = bank_args(parts, "down")
    _down_gemv_q[(pairs, triton.cdiv(H, DOWN_ROWS))](
        inter, slots, w, dn, dns, dnz, cells, H, I, K, inter.stride(0), *dn_strides, cells.stride(0), cells.stride(1),
        DTYPE=dtype, ROWS=DOWN_ROWS, COLS=DOWN_COLS, INTERP=interp, FMT=code, GROUP=group, FP8HW=fp8_hardware(x),
        num_warps=DOWN_WARPS,
    )
