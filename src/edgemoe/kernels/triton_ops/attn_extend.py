"""Paged extend / prefill attention: flash-attention tiles over the varlen batch.

One program per (block of BLOCK_M new tokens, sequence, query head) walks the context
in BLOCK_N key blocks through the page table (cached prefix and the new tokens alike),
with an online softmax in fp32 (base 2).

NOTE: key blocks start at multiples of BLOCK_N in absolute positions, and a key block
that is fully masked for a query row leaves its running max, sum and accumulator
exactly unchanged (scale 1, weights 0), so a token's output does not depend on which
query block it landed in: chunked prefill, batch composition and q_len leave it alone.

The key-block step and the fp8 cache's (`FP8KV`) reading are attn_common.py's, as in the
decode kernel. With sinks (`HAS_SINKS`) every row starts from its head's sink (max s_h,
sum 1): a fully masked block still leaves a row exactly as it was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.attn_common import (
    kv_slots,
    pv_accumulate,
    qk_scores,
    sink_logit,
    softmax_step,
)
from edgemoe.kernels.triton_ops.attn_decode import LOG2E, kv_bytes, kv_scales, sink_arg
from edgemoe.kernels.triton_ops.common import (
    fp8_hardware,
    interpreting,
    round_to,
    tl_dtype,
)


def extend_config(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) by head dim; K and V tiles stay within
    16 KiB per stage so sm_86/sm_89 (~99 KiB of shared memory per block) run them. Rows
    padded to 512 dims or more (MLA's 576-wide latent row, padded to 1,024): 16 x 16 tiles,
    one stage (64 x 32 at two stages asked 384 KiB of an H100's 227, 2026-12-06)."""
    if head_dim <= 128:
        return (64, 64, 4, 2)
    return (64, 32, 8, 2) if head_dim <= 256 else (16, 16, 8, 1)


@triton.jit
def _extend(
    q_ptr, k_ptr, v_ptr, o_ptr, pt_ptr, rows_ptr, cu_ptr, lens_ptr, ks_ptr, vs_ptr, sinks_ptr,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_pr, stride_ss,
    qk_scale, window, page_size,
    G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    qb = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (last) query blocks start first
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    if qb * BLOCK_M >= q_len:
        return
    seq_len = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    kvh = h // G
    i = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ok = i < q_len
    q_pos = seq_len - q_len + i
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    q_rows = (q_start + i).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + d[None, :],
                mask=i_ok[:, None] & d_ok[None, :], other=0.0)
    end = seq_len - q_len + tl.minimum(qb * BLOCK_M + BLOCK_M, q_len)  # past the block's last query
    lo = tl.where(window > 0, tl.maximum(seq_len - q_len + qb * BLOCK_M - window + 1, 0), 0)
    if HAS_SINKS:  # the sink as a key seen first: logit s_h, weight exp2(0) = 1, value 0
        m = tl.zeros([BLOCK_M], tl.float32) + sink_logit(sinks_ptr, h)
        l = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for n0 in range(lo // BLOCK_N * BLOCK_N, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        slot = kv_slots(pt_ptr, row, stride_pr, n, n_ok, page_size)
        kv_ok = n_ok[:, None] & d_ok[None, :]
        s = qk_scores(q, k_ptr, ks_ptr, slot, kvh, d, kv_ok, n_ok, stride_ks, stride_kh, stride_ss, qk_scale,
                      DTYPE, INTERP, FP8KV, FP8HW)
        visible = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        visible = visible & ((window <= 0) | (n[None, :] > q_pos[:, None] - window))
        # A row's first blocks can be all masked (window, causality): it keeps weights 0
        # (and a sink of logit -inf is dropped by the first visible block's rescale).
        m_new, l, alpha, p = softmax_step(m, l, s, visible, True)
        acc = pv_accumulate(acc, alpha, p, v_ptr, vs_ptr, slot, kvh, d, kv_ok, n_ok, stride_vs, stride_vh, stride_ss,
                            DTYPE, INTERP, FP8KV, FP8HW)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    o = o_ptr + q_rows[:, None] * stride_ot + h * stride_oh + d[None, :]
    tl.store(o, round_to(out, DTYPE, INTERP), mask=i_ok[:, None] & d_ok[None, :])


def extend_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
    scale: float, window: int | None, max_q_len: int, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    T, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    B = seq_lens.shape[0]
    if T == 0 or B == 0 or max_q_len == 0:
        return out
    if Hq % Hkv or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("need Hq % Hkv == 0 and a unit stride on the head dim")
    block_m, block_n, warps, stages = extend_config(D)
    ks, vs, stride_ss = kv_scales(k_scale, v_scale, k_cache)
    sinks_arg, has_sinks = sink_arg(sinks, Hq, q)
    k_cache, v_cache = kv_bytes(k_cache), kv_bytes(v_cache)
    _extend[(triton.cdiv(max_q_len, block_m), B, Hq)](
        q, k_cache, v_cache, out, page_table, req_rows, cu_seqlens_q, seq_lens, ks, vs, sinks_arg,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), page_table.stride(0), stride_ss,
        scale * LOG2E, window or 0, page_size,
        G=Hq // Hkv, D=D, D_PAD=triton.next_power_of_2(D), BLOCK_M=block_m, BLOCK_N=block_n,
        DTYPE=tl_dtype(q.dtype), INTERP=interpreting(q), FP8KV=k_scale is not None, FP8HW=fp8_hardware(q),
        HAS_SINKS=has_sinks, num_warps=warps, num_stages=stages,
    )
    return out
