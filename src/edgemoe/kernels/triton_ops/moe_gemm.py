"""Fused MoE for many tokens (prefill): grouped GEMMs over the (token, k) pairs sorted
by slot.

`align_pairs` (torch ops on the device, no host sync, graph-capturable) groups the
pairs by slot, pads each group to a multiple of BLOCK_M and maps every BLOCK_M block of
the padded order to its slot, like vLLM's `moe_align_block_size`. The grids are sized
from the upper bound T*K + S*(BLOCK_M - 1) rows; blocks past the end exit at once.
Launch 1: x rows @ gate/up tiles (tl.dot) → act(gate) * up into the workspace [T*K, I];
launch 2: workspace rows @ down tiles → each pair's fp32 cell, weighted.

Expert biases (HAS_BIAS) and swiglu_oai (ACT 3): in the epilogues (`moe_common`), each
row's bias read by its pair's expert id; without them the kernels compile as before.

NOTE: tile sizes are constants (never derived from T): an MMA computes each output
row from its own operand row, so a pair's cell does not depend on its block-mates.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from edgemoe.kernels.activations import Activation
from edgemoe.kernels.expert_bias import ExpertBias
from edgemoe.kernels.triton_ops.common import mma
from edgemoe.kernels.triton_ops.moe_common import (
    act_consts,
    bias_args,
    block_pairs,
    moe_launch,
    store_cells_block,
    store_gated_block,
    tile_range,
)

# 64 x 64 x 64 tiles, 3 stages: 24 KiB (gate_up: A + two B tiles) of shared memory per
# stage, which fits sm_86/sm_89 (~99 KiB per block) as well as sm_80/sm_90.
BLOCK_M = 64
GU_N, GU_K, GU_WARPS, GU_STAGES = 64, 64, 4, 3
DOWN_N, DOWN_K, DOWN_WARPS, DOWN_STAGES = 64, 64, 4, 3


class PairBlocks(NamedTuple):
    """The slot-sorted, block-padded pair order.

    sorted_pairs [max_rows] int32: pair ids (t * K + k), grouped by slot, each group
    padded to a multiple of BLOCK_M with the sentinel T*K. block_slot [max_rows / BLOCK_M]
    int32: the slot of every block, -1 past the last group."""

    sorted_pairs: torch.Tensor
    block_slot: torch.Tensor


def align_pairs(slot_ids: torch.Tensor, num_slots: int, block_m: int = BLOCK_M) -> PairBlocks:
    flat = slot_ids.reshape(-1).long()
    pairs = flat.numel()
    key = torch.where(flat >= 0, flat, num_slots)  # -1 sorts after every slot
    counts = torch.zeros(num_slots + 1, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:num_slots] + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)  # [S]
    pad_start = torch.cat((pad_end.new_zeros(1), pad_end))  # [S+1]; entry S = the end
    first = torch.cumsum(counts, 0) - counts  # first sorted index of each key
    order = torch.argsort(key, stable=True)  # pairs in slot order, by pair id within a slot
    key_sorted = key[order]
    rank = torch.arange(pairs, device=flat.device) - first[key_sorted]
    max_rows = pairs + num_slots * (block_m - 1)
    max_rows = triton.cdiv(max_rows, block_m) * block_m
    # Unrouted pairs (key S) land in the trash element past max_rows.
    dest = torch.where(key_sorted < num_slots, pad_start[key_sorted] + rank, max_rows)
    sorted_pairs = torch.full((max_rows + 1,), pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(0, max_rows, block_m, device=flat.device)
    block_slot = torch.searchsorted(pad_end, starts, right=True)
    block_slot = torch.where(block_slot < num_slots, block_slot, -1).to(torch.int32)
    return PairBlocks(sorted_pairs[:max_rows], block_slot)


@triton.jit
def _gate_up_gemm(
    x_ptr, sorted_ptr, block_slot_ptr, gu_ptr, inter_ptr, eid_ptr, bgu_ptr,
    H, I, K, num_pairs, stride_xt, stride_gs, stride_gr, stride_it,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr, DTYPE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr,
):
    slot = tl.load(block_slot_ptr + tl.program_id(1))
    if slot < 0:
        return
    pair, valid = block_pairs(sorted_ptr, num_pairs, BM)
    tok = tl.where(valid, pair // K, 0).to(tl.int64)
    cols, col_ok = tile_range(0, BN, I)
    kk = tl.arange(0, BK)
    a_ptrs = x_ptr + tok[:, None] * stride_xt + kk[None, :]  # [BM, BK]
    bank = gu_ptr + slot.to(tl.int64) * stride_gs
    g_ptrs = bank + cols[None, :] * stride_gr + kk[:, None]  # [BK, BN]: gate rows, transposed
    u_ptrs = g_ptrs + I * stride_gr
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, H, BK):
        k_ok = (k0 + kk) < H
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(g_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        u = tl.load(u_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc_g = mma(a, g, acc_g, INTERP)
        acc_u = mma(a, u, acc_u, INTERP)
        a_ptrs += BK
        g_ptrs += BK
        u_ptrs += BK
    store_gated_block(inter_ptr, stride_it, pair, valid, cols, col_ok, acc_g, acc_u, ACT, DTYPE, INTERP, eid_ptr,
                      bgu_ptr, I, HAS_BIAS, ALPHA, LIMIT)


@triton.jit
def _down_gemm(
    inter_ptr, sorted_ptr, block_slot_ptr, w_ptr, down_ptr, cells_ptr, eid_ptr, bd_ptr,
    H, I, K, num_pairs, stride_it, stride_ds, stride_dr, stride_ct, stride_ck,
    HAS_BIAS: tl.constexpr, DTYPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr,
):
    slot = tl.load(block_slot_ptr + tl.program_id(1))
    if slot < 0:
        return
    pair, valid = block_pairs(sorted_ptr, num_pairs, BM)
    safe = tl.where(valid, pair, 0)
    cols, col_ok = tile_range(0, BN, H)
    kk = tl.arange(0, BK)
    a_ptrs = inter_ptr + safe.to(tl.int64)[:, None] * stride_it + kk[None, :]  # [BM, BK]
    b_ptrs = down_ptr + slot.to(tl.int64) * stride_ds + cols[None, :] * stride_dr + kk[:, None]  # [BK, BN]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, I, BK):
        k_ok = (k0 + kk) < I
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = mma(a, b, acc, INTERP)
        a_ptrs += BK
        b_ptrs += BK
    store_cells_block(cells_ptr, w_ptr, acc, safe, valid, cols, col_ok, K, stride_ct, stride_ck, DTYPE, INTERP,
                      eid_ptr, bd_ptr, H, HAS_BIAS)


def moe_prefill_triton(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, cells: torch.Tensor, act: str | Activation, workspace: torch.Tensor | None = None,
    bias: ExpertBias | None = None, expert_ids: torch.Tensor | None = None,
) -> None:
    run = moe_launch(x, slot_ids, weights, cells, gate_up.shape[1] // 2, workspace)
    if run is None:
        return
    b = bias_args(bias, expert_ids, slot_ids)
    x, H, I, K, pairs, inter = run.x, run.H, run.I, run.K, run.pairs, run.inter
    gate_up, down = gate_up.contiguous(), down.contiguous()
    blocks = align_pairs(slot_ids, gate_up.shape[0])
    num_blocks = blocks.block_slot.numel()
    _gate_up_gemm[(triton.cdiv(I, GU_N), num_blocks)](
        x, blocks.sorted_pairs, blocks.block_slot, gate_up, inter, b.expert_ids, b.gate_up,
        H, I, K, pairs, x.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        **act_consts(act).consts(), HAS_BIAS=b.has_bias, DTYPE=run.dtype, BM=BLOCK_M, BN=GU_N, BK=GU_K,
        INTERP=run.interp,
        num_warps=GU_WARPS, num_stages=GU_STAGES,
    )
    _down_gemm[(triton.cdiv(H, DOWN_N), num_blocks)](
        inter, blocks.sorted_pairs, blocks.block_slot, run.weights, down, cells, b.expert_ids, b.down,
        H, I, K, pairs, inter.stride(0), down.stride(0), down.stride(1), cells.stride(0), cells.stride(1),
        HAS_BIAS=b.has_bias, DTYPE=run.dtype, BM=BLOCK_M, BN=DOWN_N, BK=DOWN_K, INTERP=run.interp,
        num_warps=DOWN_WARPS, num_stages=DOWN_STAGES,
    )
