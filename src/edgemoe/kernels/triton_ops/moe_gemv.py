"""Fused MoE for few tokens (decode): weight streaming per routed (token, k) pair.

At batch 1 the step is pure weight bandwidth (Qwen3-30B-A3B: 8 experts x 9.4 MB per
layer), so the grid splits each pair's output rows into many programs, each streaming
its rows of the slot's bank with wide loads along H. Launch 1: gate and up rows →
act(gate) * up into the workspace [T*K, I] (in the activation dtype); launch 2: down
rows → the pair's fp32 cell. Rounding points follow the torch reference
(`moe_experts_partial_ref`): each projection's output, the activation and the product
are rounded to the activation dtype.

A step multiplies a [ROWS, COLS] weight tile (`weight_tile`: one vector load a thread) by
COLS activations loaded straight into the tile's layout (`moe_common.gemv_x_tile`): the
[COLS] vector it replaced went through shared memory and two barriers every step (sm_90
SASS: 130 instructions a gate/up step with 8 shared loads, now 134 with none); the products
and the fp32 sums are the same, bit for bit. `gu_stages` / `down_stages` > 1 software-
pipeline the step loops (`tl.range(num_stages=)`): loads issued ahead, sums unchanged.

Split-K (`gu_splits` S > 1, `moe_gemv_tiles.py`): at T = 1 launch 1 has only 8 pairs x
I/ROWS programs, too few loads in flight to saturate HBM, so its grid gains an axis of
S: program s reduces H's columns [s*C, (s+1)*C) (C = H/S rounded up to whole COLS tiles)
into fp32 sums of its gate and up rows, stored without atomics in a workspace [T*K, S,
2, I]. Launch 2 then builds each chunk of the activation it multiplies from those
partials: gate and up each summed over s in ascending order, then rounded where
`store_gated_rows` rounds (projection, activation, product), so S = 1 and S > 1 differ
only in the order of fp32 sums. Every down program re-derives its chunks (S x 2 fp32
reads per element, from L2): the price of no third launch. S = 1 runs the original
kernels' code (the constexpr branches fold away), bitwise as before.

Expert biases (HAS_BIAS, `moe_common`'s epilogues): each pair's expert id (`eid_ptr`)
selects its rows of the resident biases; with a split the down launch adds the gate/up
biases where it builds the activation. swiglu_oai (ACT 3, its ALPHA and LIMIT constexprs)
runs wherever the activation is computed. Without biases and for the elementwise
activations the kernels compile to the code they had.

NOTE: tile sizes and S are constants (never derived from T): a pair's cell depends only
on its token's x, its slot and its weight (batch invariance); the split-K partial sums
are fixed per pair and summed in a fixed order, so that holds with S > 1 too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from edgemoe.kernels.activations import Activation
from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.moe_gemv_tiles import MoeGemvTiles, split_cols, tiles
from edgemoe.kernels.triton_ops.common import pdl_start, round_trip
from edgemoe.kernels.triton_ops.moe_common import (
    ActConsts,
    BiasArgs,
    MoeLaunch,
    act_consts,
    bias_args,
    bias_row,
    gemv_x_tile,
    glu_h,
    moe_launch,
    store_cell_rows,
    store_gated_rows,
    tile_range,
)


@triton.jit
def store_partial_rows(part_ptr, stride_pt, pair, rows, row_ok, acc_g, acc_u, I):
    """Split-K epilogue of gate/up: this split's fp32 sums of its gate and up rows into
    the pair's partials [S, 2, I] (split = grid axis 2), unrounded."""
    out = part_ptr + pair.to(tl.int64) * stride_pt + tl.program_id(2) * 2 * I + rows
    tl.store(out, tl.sum(acc_g, axis=1), mask=row_ok)
    tl.store(out + I, tl.sum(acc_u, axis=1), mask=row_ok)


@triton.jit
def gated_chunk(part_ptr, pair, stride_pt, i0, I, ACT: tl.constexpr, DTYPE: tl.constexpr, COLS: tl.constexpr,
                SPLITS: tl.constexpr, INTERP: tl.constexpr, bgu_row=None, HAS_BIAS: tl.constexpr = False,
                ALPHA: tl.constexpr = None, LIMIT: tl.constexpr = None):
    """Split-K prologue of down: columns [i0, i0 + COLS) of the pair's act(gate)·up built
    from its partials (plus the expert's gate/up biases, `bgu_row`, with HAS_BIAS), in
    fp32 holding activation-dtype values (0 past I). NOTE: the sums
    run over s in ascending order and the roundings are `store_gated_rows`'s, so the value
    is the S = 1 workspace's but for fp32 sum order. A [COLS] vector, not `gemv_x_tile`'s
    tile: built once a column and broadcast through shared memory, where the tile would
    repeat the activation for every row a thread holds (572 SASS instructions a step at
    S = 4 against 146)."""
    cols = i0 + tl.arange(0, COLS)
    col_ok = cols < I
    base = part_ptr + pair.to(tl.int64) * stride_pt + cols
    gate = tl.load(base, mask=col_ok, other=0.0)
    up = tl.load(base + I, mask=col_ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        gate += tl.load(base + s * 2 * I, mask=col_ok, other=0.0)
        up += tl.load(base + (s * 2 + 1) * I, mask=col_ok, other=0.0)
    gate = round_trip(gate, DTYPE, INTERP)
    up = round_trip(up, DTYPE, INTERP)
    if HAS_BIAS:
        gate += tl.load(bgu_row + cols, mask=col_ok, other=0.0).to(tl.float32)
        up += tl.load(bgu_row + I + cols, mask=col_ok, other=0.0).to(tl.float32)
    h = glu_h(gate, up, ACT, HAS_BIAS, ALPHA, LIMIT, DTYPE, INTERP)
    return round_trip(h, DTYPE, INTERP)


@triton.jit
def weight_tile(bank, rows, row_ok, c0, n, stride_r, COLS: tl.constexpr):
    """GEMV step: columns [c0, c0 + COLS) of a slot bank's `rows` in fp32 (0 past n or for
    rows past the matrix): one vector load a thread."""
    cols = c0 + tl.arange(0, COLS)
    ok = row_ok[:, None] & (cols < n)[None, :]
    return tl.load(bank + rows[:, None] * stride_r + cols[None, :], mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _gate_up_gemv(
    x_ptr, slot_ptr, gu_ptr, inter_ptr, eid_ptr, bgu_ptr,
    H, I, K, SPLIT_H, stride_xt, stride_gs, stride_gr, stride_it,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr, DTYPE: tl.constexpr,
    ROWS: tl.constexpr, COLS: tl.constexpr, SPLITS: tl.constexpr,
    STAGES: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    pair = tl.program_id(0)
    # NOTE: no weight load before the wait: the slot banks are written by the expert
    # cache's gather within the step, and which slot to read is itself a kernel's output.
    pdl_start(USE_PDL)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    t = pair // K
    rows, row_ok = tile_range(1, ROWS, I)
    bank = gu_ptr + slot.to(tl.int64) * stride_gs
    acc_g = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, COLS], dtype=tl.float32)
    if SPLITS == 1:
        lo = 0
        hi = H
    else:  # SPLIT_H is a multiple of COLS: every split starts on a tile boundary
        lo = tl.program_id(2) * SPLIT_H
        hi = tl.minimum(lo + SPLIT_H, H)
    for h0 in tl.range(lo, hi, COLS, num_stages=STAGES):
        xv = gemv_x_tile(x_ptr, t, stride_xt, h0, hi, ROWS, COLS)
        g = weight_tile(bank, rows, row_ok, h0, hi, stride_gr, COLS)
        u = weight_tile(bank, rows + I, row_ok, h0, hi, stride_gr, COLS)
        acc_g += g * xv
        acc_u += u * xv
    if SPLITS == 1:
        bgu_row = bias_row(eid_ptr, bgu_ptr, pair, 2 * I, HAS_BIAS)
        store_gated_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u, ACT, DTYPE, INTERP, bgu_row, I,
                         HAS_BIAS, ALPHA, LIMIT)
    else:  # the biases join where the down launch sums the partials
        store_partial_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u, I)


@triton.jit
def _down_gemv(
    inter_ptr, slot_ptr, w_ptr, down_ptr, cells_ptr, eid_ptr, bgu_ptr, bd_ptr,
    H, I, K, stride_it, stride_ds, stride_dr, stride_ct, stride_ck,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr, DTYPE: tl.constexpr,
    ROWS: tl.constexpr, COLS: tl.constexpr, SPLITS: tl.constexpr,
    STAGES: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    pair = tl.program_id(0)
    pdl_start(USE_PDL)  # NOTE: no weight load before it (the slot banks, as in _gate_up_gemv)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows, row_ok = tile_range(1, ROWS, H)
    bank = down_ptr + slot.to(tl.int64) * stride_ds
    bgu_row = bias_row(eid_ptr, bgu_ptr, pair, 2 * I, HAS_BIAS and SPLITS > 1)
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for i0 in tl.range(0, I, COLS, num_stages=STAGES):
        if SPLITS == 1:
            a = gemv_x_tile(inter_ptr, pair, stride_it, i0, I, ROWS, COLS)
        else:
            a = gated_chunk(inter_ptr, pair, stride_it, i0, I, ACT, DTYPE, COLS, SPLITS, INTERP, bgu_row, HAS_BIAS,
                            ALPHA, LIMIT)[None, :]
        acc += weight_tile(bank, rows, row_ok, i0, I, stride_dr, COLS) * a
    bd_row = bias_row(eid_ptr, bd_ptr, pair, H, HAS_BIAS)
    store_cell_rows(cells_ptr, w_ptr, acc, pair, rows, row_ok, K, stride_ct, stride_ck, DTYPE, INTERP, bd_row,
                    HAS_BIAS)


class DecodeLaunch(NamedTuple):
    """One decode call's checked arguments and tiles, for its two launches (the GPU bench
    times them apart)."""

    run: MoeLaunch
    slots: torch.Tensor  # [T*K] int32
    gate_up: torch.Tensor
    down: torch.Tensor
    cells: torch.Tensor
    act: ActConsts
    tiles: MoeGemvTiles
    pdl: bool  # programmatic dependent launch (backend.pdl_enabled)
    bias: BiasArgs


def decode_launch(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> DecodeLaunch | None:
    """The launches' arguments; None when there is no pair. `workspace`: >= T*K*I elements
    of x's dtype, or with split-K (S = tiles().gu_splits > 1) >= T*K*S*2*I fp32; else one
    is allocated (under a CUDA graph capture: from its pool, sized by the captured T and S)."""
    t = tiles()
    I = gate_up.shape[1] // 2
    run = moe_launch(x, slot_ids, weights, cells, I, workspace, t.gu_splits * 2 * I if t.gu_splits > 1 else 0)
    if run is None:
        return None
    slots = slot_ids.to(torch.int32).contiguous().view(-1)
    return DecodeLaunch(run, slots, gate_up.contiguous(), down.contiguous(), cells, act_consts(act), t,
                        pdl_enabled(x.device), bias_args(bias, expert_ids, slots))


def gate_up_launch(d: DecodeLaunch) -> None:
    run, t, gu, b = d.run, d.tiles, d.gate_up, d.bias
    _gate_up_gemv[(run.pairs, triton.cdiv(run.I, t.gu_rows), t.gu_splits)](
        run.x, d.slots, gu, run.inter, b.expert_ids, b.gate_up, run.H, run.I, run.K,
        split_cols(run.H, t.gu_splits, t.gu_cols), run.x.stride(0), gu.stride(0), gu.stride(1), run.inter.stride(0),
        **d.act.consts(), HAS_BIAS=b.has_bias, DTYPE=run.dtype, ROWS=t.gu_rows, COLS=t.gu_cols, SPLITS=t.gu_splits,
        STAGES=t.gu_stages,
        INTERP=run.interp, USE_PDL=d.pdl, launch_pdl=d.pdl, num_warps=t.gu_warps,
    )


def down_launch(d: DecodeLaunch) -> None:
    run, t, dn, cells, b = d.run, d.tiles, d.down, d.cells, d.bias
    # The activation is read only with a split: S = 1 compiles one variant for all of them.
    act = d.act if t.gu_splits > 1 else ActConsts(0, 0.0, 0.0)
    _down_gemv[(run.pairs, triton.cdiv(run.H, t.down_rows))](
        run.inter, d.slots, run.weights, dn, cells, b.expert_ids, b.gate_up, b.down, run.H, run.I, run.K,
        run.inter.stride(0), dn.stride(0), dn.stride(1), cells.stride(0), cells.stride(1),
        **act.consts(), HAS_BIAS=b.has_bias, DTYPE=run.dtype, ROWS=t.down_rows, COLS=t.down_cols, SPLITS=t.gu_splits,
        STAGES=t.down_stages,
        INTERP=run.interp, USE_PDL=d.pdl, launch_pdl=d.pdl, num_warps=t.down_warps,
    )


def moe_decode_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> None:
    """`moe_fused.moe_decode`'s contract (`decode_launch` says what `workspace` must hold)."""
    d = decode_launch(x, slot_ids, weights, gate_up, down, cells, act, workspace, bias, expert_ids)
    if d is not None:
        gate_up_launch(d)
        down_launch(d)
