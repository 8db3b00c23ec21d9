"""Paged decode attention's split launch for a cache whose value is its key: one kv head of
a row wider than 256 dims that is not a power of two (multi-head latent attention's
[k_pe | latent] row, 64 + 512 = 576), K and V one tensor (`KVPool(shared_kv=True)`).

The generic split (`attn_decode._decode_split`) pads such a row to the next power of two
(576 → 1,024: 44% of every tile, product and accumulator masked) and loads each key block
twice, as K and as V. Here the row is two parts of power-of-two widths, D1 (the largest
power of two below D: 512) and D2 = D - D1 (64, padded to a power of two): a block's
parts are loaded once, its scores are the two parts' products summed, and both parts of
the accumulator take P times the same loaded parts. The split bounds, the online softmax
and the workspace ([B, Hq, SPLITS, D] fp32 outputs and base-2 LSEs) are the generic
split's, so `_decode_merge` merges them unchanged (sinks and windows included). No fp8
cache here (the generic split reads one). `EDGEMOE_SHARED_SPLIT=0` sends every cache to the
generic split (an A/B, or a way around a GPU this launch does not compile for).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.env_switch import env_switch
from edgemoe.kernels.triton_ops.attn_common import kv_slots, softmax_step
from edgemoe.kernels.triton_ops.attn_decode import split_bounds
from edgemoe.kernels.triton_ops.common import mma, pdl_start, round_to


def shared_parts(head_dim: int) -> tuple[int, int]:
    """(D1, D2): the row's power-of-two first part and the rest."""
    d1 = 1 << (head_dim.bit_length() - 1)
    return d1, head_dim - d1


def takes_shared_split(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None) -> bool:
    """A cache this launch serves: V is K's tensor (same memory, same layout), one kv head,
    a row wider than 256 dims that is not a power of two, no fp8 scales."""
    D = k_cache.shape[-1]
    return (env_switch("EDGEMOE_SHARED_SPLIT", True) and k_scale is None and k_cache.shape[1] == 1 and D > 256
            and D & (D - 1) != 0 and v_cache.data_ptr() == k_cache.data_ptr() and v_cache.stride() == k_cache.stride())


@triton.jit
def _shared_split(
    q_ptr, kv_ptr, pt_ptr, rows_ptr, lens_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_ks, stride_pr, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    qk_scale, window, page_size,
    G: tl.constexpr, G_PAD: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, D2_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, MIN_BLOCKS: tl.constexpr, DTYPE: tl.constexpr,
    INTERP: tl.constexpr, USE_PDL: tl.constexpr, STAGES: tl.constexpr,
):
    """One program per (sequence, split), all G query heads of the one kv head at once."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    pdl_start(USE_PDL)  # NOTE: before the early return below too (see pdl_start)
    seq_len = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    g = tl.arange(0, G_PAD)
    d1 = tl.arange(0, D1)
    d2 = tl.arange(0, D2_PAD)
    g_ok = (g < G)[:, None]
    d2_ok = (d2 < D2)[None, :]
    q_row = q_ptr + b.to(tl.int64) * stride_qb + g[:, None] * stride_qh
    qa = tl.load(q_row + d1[None, :], mask=g_ok, other=0.0)
    qb = tl.load(q_row + D1 + d2[None, :], mask=g_ok & d2_ok, other=0.0)
    lo, split_len, first, last = split_bounds(seq_len, window, SPLITS, BLOCK_N, MIN_BLOCKS)
    if (split < first) | (split >= last):  # no visible key here
        return
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    n_first = tl.maximum(start, lo // BLOCK_N * BLOCK_N)  # a multiple of BLOCK_N holding a visible key
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc_a = tl.zeros([G_PAD, D1], tl.float32)
    acc_b = tl.zeros([G_PAD, D2_PAD], tl.float32)
    for n0 in tl.range(n_first, end, BLOCK_N, num_stages=STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = (n < end) & (n >= lo)
        slot = kv_slots(pt_ptr, row, stride_pr, n, n < end, page_size)
        rows = kv_ptr + slot[:, None] * stride_ks
        ka = tl.load(rows + d1[None, :], mask=n_ok[:, None], other=0.0)
        kb = tl.load(rows + D1 + d2[None, :], mask=n_ok[:, None] & d2_ok, other=0.0)
        s = mma(qb, tl.trans(kb), mma(qa, tl.trans(ka), tl.zeros([G_PAD, BLOCK_N], tl.float32), INTERP), INTERP)
        m_new, l, alpha, p = softmax_step(m, l, s * qk_scale, n_ok[None, :], False)
        p = round_to(p, DTYPE, INTERP)
        acc_a = mma(p, ka, acc_a * alpha[:, None], INTERP)
        acc_b = mma(p, kb, acc_b * alpha[:, None], INTERP)
        m = m_new
    out = o_ptr + b.to(tl.int64) * stride_ob + g[:, None] * stride_oh + split * stride_os
    tl.store(out + d1[None, :], acc_a / l[:, None], mask=g_ok)
    tl.store(out + D1 + d2[None, :], acc_b / l[:, None], mask=g_ok & d2_ok)
    tl.store(lse_ptr + b * stride_lb + g * stride_lh + split, m + tl.log2(l), mask=g < G)


def shared_split(q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor, req_rows: torch.Tensor,
                 seq_lens: torch.Tensor, page_size: int, qk_scale: float, window: int, o_part: torch.Tensor,
                 lse: torch.Tensor, block_n: int, splits: int, min_blocks: int, warps: int, stages: int,
                 dtype: tl.dtype, interp: bool, pdl: bool) -> None:
    """Launch the split over `kv_cache` [slots, 1, D] into `o_part` [B, Hq, splits, D] / `lse`
    [B, Hq, splits] (the generic split's workspace; `qk_scale` carries log2 e)."""
    B, Hq, D = q.shape
    d1, d2 = shared_parts(D)
    _shared_split[(B, splits)](
        q, kv_cache, page_table, req_rows, seq_lens, o_part, lse,
        q.stride(0), q.stride(1), kv_cache.stride(0), page_table.stride(0), o_part.stride(0), o_part.stride(1),
        o_part.stride(2), lse.stride(0), lse.stride(1), qk_scale, window, page_size,
        G=Hq, G_PAD=max(16, triton.next_power_of_2(Hq)), D1=d1, D2=d2, D2_PAD=max(16, triton.next_power_of_2(d2)),
        BLOCK_N=block_n, SPLITS=splits, MIN_BLOCKS=min_blocks, DTYPE=dtype, INTERP=interp, USE_PDL=pdl,
        STAGES=stages, launch_pdl=pdl, num_warps=warps, num_stages=stages,
    )
