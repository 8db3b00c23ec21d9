"""Pieces shared by the four fused-MoE kernels (moe_gemv, moe_gemv_q, moe_gemm, moe_gemm_q).

Device side: `@triton.jit` helpers for the tile indices, the slot bank addressing and
the two epilogues (act(gate)·up into the workspace; a pair's weighted output into its
fp32 cell). Triton inlines them into each kernel, so a kernel compiles to the code it
had with them written out. Host side: the launch preparation every entry point repeats
and the bank arguments of the quantised kernels.

NOTE: the rounding points are the torch reference's (`moe_experts_partial_ref`): each
projection's output, the activation and the product are rounded to the activation
dtype, the down projection's output before its routing weight multiplies it. With expert
biases (HAS_BIAS) or swiglu_oai (ACT 3) the biases are added in fp32 to the rounded
projections and the GLU runs in fp32, h rounded once (`moe_reference.expert_mlp`).

Biases are read by expert id (`eid_ptr`: the pair's routing id), never by slot: they stay
resident for every expert. The epilogues take them as trailing arguments whose defaults
(HAS_BIAS False) fold every bias load away, so a kernel without them compiles as before.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from edgemoe.kernels.activations import Activation, kernel_activation
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.triton_ops.common import (
    ACT_CODES,
    activate,
    interpreting,
    round_to,
    round_trip,
    tl_dtype,
)
from edgemoe.quant import Parts

# The MoE kernels' activation codes: `common.activate`'s elementwise ones, and gpt-oss's
# GLU-level clamped SwiGLU (`glu_h`).
MOE_ACT_CODES = {**ACT_CODES, "swiglu_oai": 3}
SWIGLU_OAI: tl.constexpr = tl.constexpr(MOE_ACT_CODES["swiglu_oai"])


@triton.jit
def tile_range(AXIS: tl.constexpr, SIZE: tl.constexpr, n):
    """The SIZE indices of this program's tile along grid axis AXIS, and which are < n."""
    idx = tl.program_id(AXIS) * SIZE + tl.arange(0, SIZE)
    return idx, idx < n


@triton.jit
def block_pairs(sorted_ptr, num_pairs, BM: tl.constexpr):
    """The BM pair ids of this program's block (grid axis 1) of the slot-sorted order
    (`align_pairs`), and which are real pairs (the padding holds num_pairs)."""
    pair = tl.load(sorted_ptr + tl.program_id(1) * BM + tl.arange(0, BM))
    return pair, pair < num_pairs


@triton.jit
def slot_banks(data_ptr, scale_ptr, zero_ptr, slot, stride_ds, stride_ss):
    """One slot's quantised bank: its data, scales and zero points (64-bit offsets)."""
    s64 = slot.to(tl.int64)
    return data_ptr + s64 * stride_ds, scale_ptr + s64 * stride_ss, zero_ptr + s64 * stride_ss


@triton.jit
def glu_h(gate, up, ACT: tl.constexpr, FP32_GLU: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
          DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """h = act(gate)·up of the rounded (and biased) projections, in fp32 before h's own
    rounding. swiglu_oai, and any GLU with biases (FP32_GLU), stay in fp32 throughout;
    otherwise the activation is rounded first, as torch rounds it."""
    if ACT == SWIGLU_OAI:
        g = tl.minimum(gate, LIMIT)
        u = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        h = (u + 1.0) * (g / (1.0 + tl.exp(-ALPHA * g)))  # g · sigmoid(alpha · g)
    elif FP32_GLU:
        h = activate(gate, ACT) * up
    else:
        h = round_trip(activate(gate, ACT), DTYPE, INTERP) * up
    return h


@triton.jit
def bias_row(eid_ptr, b_ptr, pair, row_len, HAS_BIAS: tl.constexpr):
    """GEMV: the pair's expert's bias row, b_ptr + expert id · row_len (b_ptr itself
    without biases: never read)."""
    row = b_ptr
    if HAS_BIAS:
        row = b_ptr + tl.load(eid_ptr + pair).to(tl.int64) * row_len
    return row


@triton.jit
def bias_block(eid_ptr, b_ptr, safe, valid, cols, col_ok, row_len, offset):
    """GEMM: the [BM, BN] bias tile of the block's pairs (`safe`: padding mapped to pair 0),
    columns `cols` + offset of each pair's expert's row, in fp32 (0 for padding)."""
    e = tl.load(eid_ptr + safe, mask=valid, other=0).to(tl.int64)
    at = b_ptr + e[:, None] * row_len + offset + cols[None, :]
    return tl.load(at, mask=valid[:, None] & col_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def store_gated_block(inter_ptr, stride_it, pair, valid, cols, col_ok, acc_g, acc_u,
                      ACT: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr, eid_ptr=None, bgu_ptr=None,
                      I=None, HAS_BIAS: tl.constexpr = False, ALPHA: tl.constexpr = None,
                      LIMIT: tl.constexpr = None):
    """GEMM epilogue of gate/up: a [BM, BN] block of act(gate)·up into the pairs'
    workspace rows (padding rows skipped); with HAS_BIAS the experts' gate/up biases
    (bgu_ptr [E, 2I]) added first."""
    gate = round_trip(acc_g, DTYPE, INTERP)
    up = round_trip(acc_u, DTYPE, INTERP)
    if HAS_BIAS:
        safe = tl.where(valid, pair, 0)
        gate += bias_block(eid_ptr, bgu_ptr, safe, valid, cols, col_ok, 2 * I, 0)
        up += bias_block(eid_ptr, bgu_ptr, safe, valid, cols, col_ok, 2 * I, I)
    h = glu_h(gate, up, ACT, HAS_BIAS, ALPHA, LIMIT, DTYPE, INTERP)
    out = inter_ptr + tl.where(valid, pair, 0).to(tl.int64)[:, None] * stride_it + cols[None, :]
    tl.store(out, round_to(h, DTYPE, INTERP), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def store_cells_block(cells_ptr, w_ptr, acc, safe, valid, cols, col_ok, K, stride_ct, stride_ck,
                      DTYPE: tl.constexpr, INTERP: tl.constexpr, eid_ptr=None, bd_ptr=None, H=None,
                      HAS_BIAS: tl.constexpr = False):
    """GEMM epilogue of down: a [BM, BN] block, rounded (plus the experts' down biases,
    bd_ptr [E, H], with HAS_BIAS) and weighted, into the pairs' cells [T, K, H] (fp32;
    `safe`: the pair ids with padding mapped to 0)."""
    w = tl.load(w_ptr + safe, mask=valid, other=0.0)
    y = round_trip(acc, DTYPE, INTERP)
    if HAS_BIAS:
        y += bias_block(eid_ptr, bd_ptr, safe, valid, cols, col_ok, H, 0)
    y = y * w[:, None]
    t = (safe // K).to(tl.int64)
    out = cells_ptr + t[:, None] * stride_ct + (safe % K)[:, None] * stride_ck + cols[None, :]
    tl.store(out, y, mask=valid[:, None] & col_ok[None, :])


@triton.jit
def gemv_x_tile(ptr, row, stride, c0, n, ROWS: tl.constexpr, COLS: tl.constexpr):
    """GEMV step: columns [c0, c0 + COLS) of activation row `row` in fp32 (0 past n), loaded
    as a [ROWS, COLS] tile (the same values in every row): each thread reads the columns of
    its own weights straight into their registers (vector loads, L1 hits after the first
    row), not a [COLS] vector that a layout change sends through shared memory and two
    barriers every step (sm_90 SASS of both decode GEMVs before they used it). NOTE: the
    products are the broadcast vector's, value for value: the fp32 sums do not move."""
    cols = c0 + tl.arange(0, COLS)
    at = ptr + row.to(tl.int64) * stride + tl.zeros([ROWS, 1], dtype=tl.int32) + cols[None, :]
    return tl.load(at, mask=(cols < n)[None, :], other=0.0).to(tl.float32)


@triton.jit
def store_gated_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u,
                     ACT: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr, bgu_row=None, I=None,
                     HAS_BIAS: tl.constexpr = False, ALPHA: tl.constexpr = None, LIMIT: tl.constexpr = None):
    """GEMV epilogue of gate/up: the [ROWS, COLS] partial products summed, act(gate)·up
    into rows of the pair's workspace row; with HAS_BIAS the expert's gate/up biases
    (`bgu_row`, its row of [E, 2I]: `bias_row`) added first. NOTE: each sum is rounded
    before the next one is taken (the order the kernel had when it was tuned: the same
    instructions)."""
    gate = round_trip(tl.sum(acc_g, axis=1), DTYPE, INTERP)
    up = round_trip(tl.sum(acc_u, axis=1), DTYPE, INTERP)
    if HAS_BIAS:
        gate += tl.load(bgu_row + rows, mask=row_ok, other=0.0).to(tl.float32)
        up += tl.load(bgu_row + I + rows, mask=row_ok, other=0.0).to(tl.float32)
    h = glu_h(gate, up, ACT, HAS_BIAS, ALPHA, LIMIT, DTYPE, INTERP)
    tl.store(inter_ptr + pair.to(tl.int64) * stride_it + rows, round_to(h, DTYPE, INTERP), mask=row_ok)


@triton.jit
def store_cell_rows(cells_ptr, w_ptr, acc, pair, rows, row_ok, K, stride_ct, stride_ck,
                    DTYPE: tl.constexpr, INTERP: tl.constexpr, bd_row=None, HAS_BIAS: tl.constexpr = False):
    """GEMV epilogue of down: the [ROWS, COLS] partial products summed, rounded (plus the
    expert's down biases, `bd_row`, with HAS_BIAS) and weighted into rows of the pair's
    fp32 cell."""
    y = round_trip(tl.sum(acc, axis=1), DTYPE, INTERP)
    if HAS_BIAS:
        y += tl.load(bd_row + rows, mask=row_ok, other=0.0).to(tl.float32)
    y = y * tl.load(w_ptr + pair)
    t = pair // K
    k = pair % K
    tl.store(cells_ptr + t.to(tl.int64) * stride_ct + k * stride_ck + rows, y, mask=row_ok)


class ActConsts(NamedTuple):
    """An activation as the kernels' constexprs: ACT (`MOE_ACT_CODES`) and swiglu_oai's
    ALPHA and LIMIT (0.0 for the others, never read)."""

    code: int
    alpha: float
    limit: float

    def consts(self) -> dict[str, int | float]:
        return {"ACT": self.code, "ALPHA": self.alpha, "LIMIT": self.limit}


def act_consts(act: str | Activation) -> ActConsts:
    a = kernel_activation(act)
    if a.kernel_name == "swiglu_oai":
        assert a.alpha is not None and a.limit is not None
        return ActConsts(MOE_ACT_CODES["swiglu_oai"], a.alpha, a.limit)
    return ActConsts(MOE_ACT_CODES[a.kernel_name], 0.0, 0.0)


class BiasArgs(NamedTuple):
    """A launch's bias arguments: the pairs' expert ids [T*K] int32 and the biases [E, 2I],
    [E, H] (contiguous); without biases, stand-ins the kernels never read."""

    expert_ids: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    has_bias: bool


def bias_args(bias: ExpertBias | None, expert_ids: torch.Tensor | None, slots: torch.Tensor) -> BiasArgs:
    """`slots`: the launch's flat slot ids, the stand-in without biases (no allocation)."""
    if bias is None:
        return BiasArgs(slots, slots, slots, False)
    if expert_ids is None:
        raise ValueError("expert biases are addressed by expert id: pass expert_ids with bias")
    ids = expert_ids.to(torch.int32).contiguous().view(-1)  # NOTE: device ops only (graph-safe)
    return BiasArgs(ids, bias.gate_up.contiguous(), bias.down.contiguous(), True)


class MoeLaunch(NamedTuple):
    """What every fused-MoE entry point derives before its launches."""

    x: torch.Tensor  # [T, H], contiguous
    weights: torch.Tensor  # [T*K] fp32 routing weights
    inter: torch.Tensor  # [T*K, I] workspace (activation dtype), or moe_gemv's fp32 split-K partials
    H: int
    I: int
    K: int
    pairs: int
    dtype: tl.dtype
    interp: bool


def moe_launch(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, cells: torch.Tensor, inter_dim: int,
               workspace: torch.Tensor | None, fp32_cols: int = 0) -> MoeLaunch | None:
    """The checked launch arguments; None when there is no (token, k) pair to compute.
    `fp32_cols` > 0: the workspace holds that many fp32 values per pair instead of
    inter_dim in x's dtype (moe_gemv's split-K partials)."""
    T, H = x.shape
    K = slot_ids.shape[1]
    pairs = T * K
    if pairs == 0:
        return None
    if cells.stride(-1) != 1:
        raise ValueError("cells need a unit stride on H (they are written in place)")
    x = x.contiguous()
    w = weights.to(torch.float32).contiguous().view(-1)
    if fp32_cols:
        inter = workspace_view(workspace, pairs, fp32_cols, torch.float32, x.device)
    else:
        inter = workspace_view(workspace, pairs, inter_dim, x.dtype, x.device)
    return MoeLaunch(x, w, inter, H, inter_dim, K, pairs, tl_dtype(x.dtype), interpreting(x))


def workspace_view(workspace: torch.Tensor | None, pairs: int, cols: int, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """The [pairs, cols] intermediate: a view into `workspace` (CUDA graphs keep it static),
    else a fresh buffer (under a capture: from the graph's pool, sized by the captured T)."""
    if workspace is None:
        return torch.empty(pairs, cols, dtype=dtype, device=device)
    if workspace.dtype != dtype or workspace.numel() < pairs * cols:
        raise ValueError(f"workspace needs {pairs * cols} elements of {dtype}")
    return workspace.reshape(-1)[: pairs * cols].view(pairs, cols)


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
