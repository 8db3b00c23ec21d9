"""Fused MoE decode over quantised slot banks: `moe_gemv.py` with the weight rows
dequantised in registers (`dequant.dequant_rows`) as they stream.

Same grid and rounding points as the bf16 kernel (launch 1: gate/up rows → act(gate)·up
into the workspace; launch 2: down rows → the pair's fp32 cell): at batch 1 a program
reads each weight byte once, so the step moves the format's bytes, not bf16's. Weights
are dequantised to fp32 and multiplied in fp32 (weight-only).

At few tokens the kernels are latency-bound: a program's speed is the bytes it has in
flight a step over the memory latency, plus the arithmetic a step waits on. So a step
(`moe_gemv_q_tiles.py`, one set of tiles per format) loads the bytes bf16's 16 x 128
tile loads — 256 columns of a one-byte format, 512 of a nibble format — as sub-tiles
of at most 128 columns, each one vector load a thread, all issued before any is used,
accumulating into one [ROWS, 128] fp32 tile (bf16's registers). Scales come as one
[ROWS, pieces] tile a sub-tile, broadcast (never a load per weight); activations are
loaded straight into the weight tile's layout (no shared-memory broadcast a step); the
step loop can be software-pipelined (STAGES). The previous version loaded a scale per
weight and unpacked int4 byte by byte (a 1-byte load per weight): 219 registers and
~600 instructions a step for fp8, 255 registers with spills and ~1450 for int4, against
bf16's 72 and ~130 (sm_90 SASS).

No split-K here (moe_gemv.py's `gu_splits` is the bf16 kernel's alone): the quantised
gate/up launch keeps one program per row tile, reducing all of H.

Expert biases (HAS_BIAS, read by the pair's expert id) and swiglu_oai (ACT 3) as in
moe_gemv.py: in the shared epilogues; without them the kernels compile as before.

NOTE: tiles are constants per format (never derived from T): batch invariance, as
moe_gemv.py. Sub-tiles accumulate into one tile, so a row's fp32 sum runs in another
order than one COLS-wide tile would — fixed per configuration, whatever the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from edgemoe.kernels.activations import Activation
from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_gemv_q_tiles import MoeGemvQTiles, scale_cols, sub_cols, tiles
from edgemoe.kernels.triton_ops.common import fp8_hardware, pdl_start
from edgemoe.kernels.triton_ops.dequant import FMT_INT4, FMT_INT8, FMT_MXFP4, dequant_rows, format_code, scale_rows
from edgemoe.kernels.triton_ops.moe_common import (
    ActConsts,
    BiasArgs,
    MoeLaunch,
    act_consts,
    bank_args,
    bias_args,
    bias_row,
    gemv_x_tile,
    moe_launch,
    slot_banks,
    store_cell_rows,
    store_gated_rows,
    tile_range,
)
from edgemoe.quant import ExpertFormat, Parts


@triton.jit
def _gate_up_gemv_q(
    x_ptr, slot_ptr, gu_ptr, gus_ptr, guz_ptr, inter_ptr, eid_ptr, bgu_ptr,
    H, I, K, H_STORE, stride_xt, stride_gs, stride_gr, stride_ss, stride_sr, stride_it,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr, DTYPE: tl.constexpr,
    ROWS: tl.constexpr, COLS: tl.constexpr, SUB: tl.constexpr,
    GW: tl.constexpr, STAGES: tl.constexpr, INTERP: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr,
    FP8HW: tl.constexpr, WORDS: tl.constexpr, USE_PDL: tl.constexpr,
):
    pair = tl.program_id(0)
    pdl_start(USE_PDL)  # NOTE: no weight load before it: the slot banks are written in the step
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    t = pair // K
    rows, row_ok = tile_range(1, ROWS, I)
    bank, sbank, zbank = slot_banks(gu_ptr, gus_ptr, guz_ptr, slot, stride_gs, stride_ss)
    g_srows = scale_rows(rows, 0, I, FMT, GROUP)
    u_srows = scale_rows(rows, 1, I, FMT, GROUP)
    acc_g = tl.zeros([ROWS, SUB], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, SUB], dtype=tl.float32)
    for h0 in tl.range(0, H, COLS, num_stages=STAGES):
        for j in tl.static_range(COLS // SUB):  # a step's sub-tiles: independent loads, one accumulator
            k0 = h0 + j * SUB
            xv = gemv_x_tile(x_ptr, t, stride_xt, k0, H, ROWS, SUB)
            g = dequant_rows(bank, sbank, zbank, rows, g_srows, row_ok, k0, H, H_STORE, stride_gr, stride_sr,
                             FMT, GROUP, SUB, GW, FP8HW, WORDS)
            u = dequant_rows(bank, sbank, zbank, rows + I, u_srows, row_ok, k0, H, H_STORE, stride_gr, stride_sr,
                             FMT, GROUP, SUB, GW, FP8HW, WORDS)
            acc_g += g * xv
            acc_u += u * xv
    bgu_row = bias_row(eid_ptr, bgu_ptr, pair, 2 * I, HAS_BIAS)
    store_gated_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u, ACT, DTYPE, INTERP, bgu_row, I, HAS_BIAS,
                     ALPHA, LIMIT)


@triton.jit
def _down_gemv_q(
    inter_ptr, slot_ptr, w_ptr, dn_ptr, dns_ptr, dnz_ptr, cells_ptr, eid_ptr, bd_ptr,
    H, I, K, I_STORE, stride_it, stride_ds, stride_dr, stride_ss, stride_sr, stride_ct, stride_ck,
    HAS_BIAS: tl.constexpr, DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, SUB: tl.constexpr,
    GW: tl.constexpr,
    STAGES: tl.constexpr, INTERP: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, FP8HW: tl.constexpr,
    WORDS: tl.constexpr, USE_PDL: tl.constexpr,
):
    pair = tl.program_id(0)
    pdl_start(USE_PDL)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows, row_ok = tile_range(1, ROWS, H)
    bank, sbank, zbank = slot_banks(dn_ptr, dns_ptr, dnz_ptr, slot, stride_ds, stride_ss)
    srows = scale_rows(rows, 0, H, FMT, GROUP)
    acc = tl.zeros([ROWS, SUB], dtype=tl.float32)
    for i0 in tl.range(0, I, COLS, num_stages=STAGES):
        for j in tl.static_range(COLS // SUB):
            k0 = i0 + j * SUB
            a = gemv_x_tile(inter_ptr, pair, stride_it, k0, I, ROWS, SUB)
            d = dequant_rows(bank, sbank, zbank, rows, srows, row_ok, k0, I, I_STORE, stride_dr, stride_sr,
                             FMT, GROUP, SUB, GW, FP8HW, WORDS)
            acc += d * a
    bd_row = bias_row(eid_ptr, bd_ptr, pair, H, HAS_BIAS)
    store_cell_rows(cells_ptr, w_ptr, acc, pair, rows, row_ok, K, stride_ct, stride_ck, DTYPE, INTERP, bd_row, HAS_BIAS)


class GemvBank(NamedTuple):
    """One projection's banks as the GEMV reads them."""

    data: torch.Tensor  # bytes (int8, uint8), or int32 words of nibbles (`words`)
    scale: torch.Tensor
    zero: torch.Tensor
    strides: tuple[int, int, int, int]  # data slot, data row, scale slot, scale row (elements)
    row_len: int  # a data row's elements (the kernel's n_store)
    words: bool


def gemv_bank(parts: Parts, proj: str, nibbles: bool) -> GemvBank:
    """`bank_args`, with nibble rows of whole 4-byte words viewed as int32 (`dequant._nibble_codes`:
    one load and a shift and mask a code; other rows stay bytes)."""
    data, scale, zero, *strides = bank_args(parts, proj)
    words = nibbles and data.shape[-1] % 4 == 0 and data.storage_offset() % 4 == 0
    if words:
        data = data.view(torch.int32)
        strides = [data.stride(0), data.stride(1), *strides[2:]]
    return GemvBank(data, scale, zero, (strides[0], strides[1], strides[2], strides[3]), data.shape[-1], words)


class DecodeQLaunch(NamedTuple):
    """One decode call's checked arguments and tiles, for its two launches (the GPU bench
    times them apart)."""

    run: MoeLaunch
    slots: torch.Tensor  # [T*K] int32
    gate_up: GemvBank
    down: GemvBank
    cells: torch.Tensor
    act: ActConsts
    fmt: int  # FMT code (dequant.py)
    group: int
    tiles: MoeGemvQTiles
    fp8hw: bool
    pdl: bool  # programmatic dependent launch (backend.pdl_enabled)
    bias: BiasArgs


def decode_q_launch(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> DecodeQLaunch | None:
    """The launches' arguments with the format's tiles (read now: the override may change
    between calls); None when there is no pair."""
    run = moe_launch(x, slot_ids, weights, cells, parts["gate_up"].shape[1] // 2, workspace)
    if run is None:
        return None
    code, group = format_code(fmt)
    nibbles = code in (FMT_INT4, FMT_MXFP4)
    slots = slot_ids.to(torch.int32).contiguous().view(-1)
    return DecodeQLaunch(run, slots, gemv_bank(parts, "gate_up", nibbles), gemv_bank(parts, "down", nibbles), cells,
                         act_consts(act), code, group, tiles(fmt.name), fp8_hardware(run.x), pdl_enabled(run.x.device),
                         bias_args(bias, expert_ids, slots))


def step_widths(fmt_code: int, group: int, rows: int, cols: int, warps: int) -> tuple[int, int]:
    """(SUB, GW) of a ROWS x COLS step: sub-tile columns, and columns sharing a scale."""
    sub = sub_cols(cols, rows, warps, fmt_code in (FMT_INT4, FMT_MXFP4))
    return sub, scale_cols(sub, None if fmt_code == FMT_INT8 else group)


def gate_up_q_launch(d: DecodeQLaunch) -> None:
    run, t, b = d.run, d.tiles, d.gate_up
    sub, gw = step_widths(d.fmt, d.group, t.gu_rows, t.gu_cols, t.gu_warps)
    _gate_up_gemv_q[(run.pairs, triton.cdiv(run.I, t.gu_rows))](
        run.x, d.slots, b.data, b.scale, b.zero, run.inter, d.bias.expert_ids, d.bias.gate_up, run.H, run.I, run.K,
        b.row_len, run.x.stride(0), *b.strides, run.inter.stride(0), **d.act.consts(), HAS_BIAS=d.bias.has_bias,
        DTYPE=run.dtype, ROWS=t.gu_rows, COLS=t.gu_cols, SUB=sub, GW=gw,
        STAGES=t.gu_stages, INTERP=run.interp, FMT=d.fmt, GROUP=d.group, FP8HW=d.fp8hw, WORDS=b.words,
        USE_PDL=d.pdl, launch_pdl=d.pdl, num_warps=t.gu_warps,
    )


def down_q_launch(d: DecodeQLaunch) -> None:
    run, t, b, cells = d.run, d.tiles, d.down, d.cells
    sub, gw = step_widths(d.fmt, d.group, t.down_rows, t.down_cols, t.down_warps)
    _down_gemv_q[(run.pairs, triton.cdiv(run.H, t.down_rows))](
        run.inter, d.slots, run.weights, b.data, b.scale, b.zero, cells, d.bias.expert_ids, d.bias.down, run.H, run.I,
        run.K, b.row_len, run.inter.stride(0), *b.strides, cells.stride(0), cells.stride(1),
        HAS_BIAS=d.bias.has_bias, DTYPE=run.dtype, ROWS=t.down_rows,
        COLS=t.down_cols, SUB=sub, GW=gw, STAGES=t.down_stages, INTERP=run.interp, FMT=d.fmt, GROUP=d.group,
        FP8HW=d.fp8hw, WORDS=b.words, USE_PDL=d.pdl, launch_pdl=d.pdl, num_warps=t.down_warps,
    )


def moe_decode_q_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> None:
    """`moe_quant.moe_decode_quant`'s contract on CUDA (and under the interpreter)."""
    d = decode_q_launch(x, slot_ids, weights, parts, fmt, cells, act, workspace, bias, expert_ids)
    if d is not None:
        gate_up_q_launch(d)
        down_q_launch(d)
