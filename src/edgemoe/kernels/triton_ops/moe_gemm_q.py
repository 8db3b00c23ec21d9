"""Fused MoE prefill over quantised slot banks: `moe_gemm.py`'s grouped GEMMs with each
weight tile dequantised in registers (`dequant.py`) before its MMA.

Weight-only (every format): a tile is dequantised to fp32 and rounded to the
activations' dtype (bf16 / fp16), then the tensor cores multiply as for bf16 weights.

fp8 arithmetic (`F8DOT`, fp8 weights in 128 x 128 blocks on sm_89+, `fp8_dot()`): the
weights stay e4m3 and each [BM, 128] activation tile is quantised on the fly, one scale
per row (its largest |a| / 448), so a tile's MMA is e4m3 x e4m3 → fp32, scaled by the
activation row's and the weight block's scales: twice the tensor-core rate and half the
shared memory, at e4m3's rounding of the activations (2^-4 relative).

The pair alignment (`align_pairs`), grid, rounding points and expert biases / swiglu_oai
(the shared epilogues) are moe_gemm.py's.

NOTE: tile sizes are constants (never derived from T): batch invariance, as moe_gemm.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.env_switch import env_switch
from edgemoe.kernels.activations import Activation
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.triton_ops.common import (
    fp8_hardware,
    mma,
    round_to,
    to_e4m3,
)
from edgemoe.kernels.triton_ops.dequant import FMT_INT4, FMT_MXFP4, dequant, format_code
from edgemoe.kernels.triton_ops.moe_common import (
    act_consts,
    bank_args,
    bias_args,
    block_pairs,
    moe_launch,
    slot_banks,
    store_cells_block,
    store_gated_block,
    tile_range,
)
from edgemoe.kernels.triton_ops.moe_gemm import BLOCK_M, align_pairs
from edgemoe.quant import ExpertFormat, Parts

GU_N, GU_K, GU_WARPS, GU_STAGES = 64, 64, 4, 3
DOWN_N, DOWN_K, DOWN_WARPS, DOWN_STAGES = 64, 64, 4, 3
# The 4-bit formats unpack two weights a byte before each MMA: with 4 warps their gate/up
# launch ran ~10x its down's at GLM-4.5-Air's shape (a 1K prompt's profile, 2026-12-06),
# so they take half-depth K tiles over 8 warps (`scripts/gpu_prefill_q_sweep.py`, H100,
# T = 1024 x top-8 over 128 slots, both launches: int4 36.3 -> 6.2 ms at H 4096 / I 1408;
# mxfp4 26.6 -> 7.6; int8 and fp8 best as they were: 6.8 and 2.4).
PACKED_TILES = (64, 32, 8, 3)  # (N, K, warps, stages) of both launches
F8_K = 128  # NOTE: F8DOT tiles span exactly one weight scale block along K
E4M3_MAX = tl.constexpr(448.0)


def fp8_dot(fmt_code: int, group: int, x: torch.Tensor) -> bool:
    """Whether the fp8 arithmetic path runs: 128-blocked fp8 weights, 16-bit activations, on
    a GPU with fp8 tensor cores (sm_89+) or under the interpreter; `EDGEMOE_FP8_DOT=0`
    forces weight-only dequantisation."""
    from edgemoe.kernels.triton_ops.dequant import FMT_FP8

    if not env_switch("EDGEMOE_FP8_DOT", True) or fmt_code != FMT_FP8 or group != F8_K:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16):
        return False
    return not x.is_cuda or torch.cuda.get_device_capability(x.device) >= (8, 9)


@triton.jit
def _f8_tile(a, E4M3: tl.constexpr, INTERP: tl.constexpr):
    """[BM, BK] activations → (e4m3 tile, fp32 row scales): one scale per row."""
    af = a.to(tl.float32)
    s = tl.max(tl.abs(af), axis=1) / E4M3
    s = tl.where(s > 0, s, 1.0)
    return to_e4m3(af / s[:, None], INTERP), s


@triton.jit
def _f8_mma(a_q, a_s, w_ptrs, w_ok, w_s, acc, INTERP: tl.constexpr):
    """acc + (a_q @ w_q) · a_s[:, None] · w_s[None, :] for an e4m3 weight tile."""
    w_q = tl.load(w_ptrs, mask=w_ok, other=0).to(tl.float8e4nv, bitcast=True)  # uint8 bytes → e4m3
    return acc + mma(a_q, w_q, tl.zeros(acc.shape, tl.float32), INTERP) * a_s[:, None] * w_s[None, :]


@triton.jit
def _gate_up_gemm_q(
    x_ptr, sorted_ptr, block_slot_ptr, gu_ptr, gus_ptr, guz_ptr, inter_ptr, eid_ptr, bgu_ptr,
    H, I, K, num_pairs, stride_xt, stride_gs, stride_gr, stride_ss, stride_sr, stride_it,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr, DTYPE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, F8DOT: tl.constexpr, FP8HW: tl.constexpr,
):
    slot = tl.load(block_slot_ptr + tl.program_id(1))
    if slot < 0:
        return
    pair, valid = block_pairs(sorted_ptr, num_pairs, BM)
    tok = tl.where(valid, pair // K, 0).to(tl.int64)
    cols, col_ok = tile_range(0, BN, I)
    kk = tl.arange(0, BK)
    bank, sbank, zbank = slot_banks(gu_ptr, gus_ptr, guz_ptr, slot, stride_gs, stride_ss)
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, H, BK):
        ks = k0 + kk
        k_ok = ks < H
        a = tl.load(x_ptr + tok[:, None] * stride_xt + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        ok = k_ok[:, None] & col_ok[None, :]
        if F8DOT:
            a_q, a_s = _f8_tile(a, E4M3_MAX, INTERP)
            kb = k0 // GROUP
            w_ptrs = bank + cols.to(tl.int64)[None, :] * stride_gr + ks[:, None]
            nrb = tl.cdiv(I, GROUP)
            gs = tl.load(sbank + (cols // GROUP).to(tl.int64) * stride_sr + kb, mask=col_ok, other=0.0)
            us = tl.load(sbank + (nrb + cols // GROUP).to(tl.int64) * stride_sr + kb, mask=col_ok, other=0.0)
            acc_g = _f8_mma(a_q, a_s, w_ptrs, ok, gs, acc_g, INTERP)
            acc_u = _f8_mma(a_q, a_s, w_ptrs + I * stride_gr, ok, us, acc_u, INTERP)
        else:
            g = dequant(bank, sbank, zbank, cols[None, :], ks[:, None], ok, I, stride_gr, stride_sr, FMT, GROUP,
                        FP8HW)
            u = dequant(bank, sbank, zbank, (cols + I)[None, :], ks[:, None], ok, I, stride_gr, stride_sr, FMT,
                        GROUP, FP8HW)
            acc_g = mma(a, round_to(g, DTYPE, INTERP), acc_g, INTERP)
            acc_u = mma(a, round_to(u, DTYPE, INTERP), acc_u, INTERP)
    store_gated_block(inter_ptr, stride_it, pair, valid, cols, col_ok, acc_g, acc_u, ACT, DTYPE, INTERP, eid_ptr,
                      bgu_ptr, I, HAS_BIAS, ALPHA, LIMIT)


@triton.jit
def _down_gemm_q(
    inter_ptr, sorted_ptr, block_slot_ptr, w_ptr, dn_ptr, dns_ptr, dnz_ptr, cells_ptr, eid_ptr, bd_ptr,
    H, I, K, num_pairs, stride_it, stride_ds, stride_dr, stride_ss, stride_sr, stride_ct, stride_ck,
    HAS_BIAS: tl.constexpr, DTYPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, F8DOT: tl.constexpr, FP8HW: tl.constexpr,
):
    slot = tl.load(block_slot_ptr + tl.program_id(1))
    if slot < 0:
        return
    pair, valid = block_pairs(sorted_ptr, num_pairs, BM)
    safe = tl.where(valid, pair, 0)
    cols, col_ok = tile_range(0, BN, H)
    kk = tl.arange(0, BK)
    bank, sbank, zbank = slot_banks(dn_ptr, dns_ptr, dnz_ptr, slot, stride_ds, stride_ss)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, I, BK):
        ks = k0 + kk
        k_ok = ks < I
        a = tl.load(inter_ptr + safe.to(tl.int64)[:, None] * stride_it + ks[None, :],
                    mask=valid[:, None] & k_ok[None, :], other=0.0)
        ok = k_ok[:, None] & col_ok[None, :]
        if F8DOT:
            a_q, a_s = _f8_tile(a, E4M3_MAX, INTERP)
            ws = tl.load(sbank + (cols // GROUP).to(tl.int64) * stride_sr + k0 // GROUP, mask=col_ok, other=0.0)
            acc = _f8_mma(a_q, a_s, bank + cols.to(tl.int64)[None, :] * stride_dr + ks[:, None], ok, ws, acc, INTERP)
        else:
            b = dequant(bank, sbank, zbank, cols[None, :], ks[:, None], ok, H, stride_dr, stride_sr, FMT, GROUP,
                        FP8HW)
            acc = mma(a, round_to(b, DTYPE, INTERP), acc, INTERP)
    store_cells_block(cells_ptr, w_ptr, acc, safe, valid, cols, col_ok, K, stride_ct, stride_ck, DTYPE, INTERP,
                      eid_ptr, bd_ptr, H, HAS_BIAS)


def moe_prefill_q_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None, f8dot: bool | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> None:
    """`f8dot`: force the fp8 arithmetic path on or off (default: `fp8_dot`)."""
    run = moe_launch(x, slot_ids, weights, cells, parts["gate_up"].shape[1] // 2, workspace)
    if run is None:
        return
    b = bias_args(bias, expert_ids, slot_ids)
    x, H, I, K, pairs, inter = run.x, run.H, run.I, run.K, run.pairs, run.inter
    code, group = format_code(fmt)
    f8 = fp8_dot(code, group, x) if f8dot is None else f8dot
    gu_n, gu_k, gu_warps, gu_stages = GU_N, GU_K, GU_WARPS, GU_STAGES
    dn_n, dn_k, dn_warps, dn_stages = DOWN_N, DOWN_K, DOWN_WARPS, DOWN_STAGES
    if code in (FMT_INT4, FMT_MXFP4):
        gu_n, gu_k, gu_warps, gu_stages = dn_n, dn_k, dn_warps, dn_stages = PACKED_TILES
    if f8:
        gu_k = dn_k = F8_K
    blocks = align_pairs(slot_ids, parts["gate_up"].shape[0])
    num_blocks = blocks.block_slot.numel()
    gu, gus, guz, *gu_strides = bank_args(parts, "gate_up")
    _gate_up_gemm_q[(triton.cdiv(I, gu_n), num_blocks)](
        x, blocks.sorted_pairs, blocks.block_slot, gu, gus, guz, inter, b.expert_ids, b.gate_up,
        H, I, K, pairs, x.stride(0), *gu_strides, inter.stride(0),
        **act_consts(act).consts(), HAS_BIAS=b.has_bias, DTYPE=run.dtype, BM=BLOCK_M, BN=gu_n, BK=gu_k,
        INTERP=run.interp, FMT=code, GROUP=group,
        FP8HW=fp8_hardware(x), F8DOT=f8, num_warps=gu_warps, num_stages=gu_stages,
    )
    dn, dns, dnz, *dn_strides = bank_args(parts, "down")
    _down_gemm_q[(triton.cdiv(H, dn_n), num_blocks)](
        inter, blocks.sorted_pairs, blocks.block_slot, run.weights, dn, dns, dnz, cells, b.expert_ids, b.down,
        H, I, K, pairs, inter.stride(0), *dn_strides, cells.stride(0), cells.stride(1),
        HAS_BIAS=b.has_bias, DTYPE=run.dtype, BM=BLOCK_M, BN=dn_n, BK=dn_k, INTERP=run.interp, FMT=code, GROUP=group,
        FP8HW=fp8_hardware(x), F8DOT=f8, num_warps=dn_warps, num_stages=dn_stages,
    )
