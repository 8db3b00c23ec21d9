"""The key-block step shared by the paged attention kernels (attn_decode, attn_extend).

One step of the online softmax over a BLOCK_N block of key positions: the positions'
cache slots through the page table (`kv_slots`), the base-2 scores of the query rows
against the block's keys (`qk_scores`), the running max / sum update (`softmax_step`)
and P·V into the accumulator (`pv_accumulate`). `@triton.jit` helpers: Triton inlines
them, so each kernel compiles to the code it had with them written out.

fp8 cache (`FP8KV`): keys/values are e4m3 bytes with one fp32 scale per (slot, kv head);
a key block is widened to the query dtype (exact) and its scales multiply the scores;
the value scales multiply the probabilities before their rounding, so V is read as stored.

Attention sinks (`HAS_SINKS`, gpt-oss): query head h's logit s_h joins each row's softmax
denominator with no value. The kernels start a row's online softmax as if the sink were a
key already seen (`sink_logit`: running max s_h in base 2, running sum exp2(0) = 1, output
0): extend's rows in `_extend`, decode's in its merge (once per row, not per split).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import e4m3_to_f32, mma, round_to


@triton.jit
def kv_slots(pt_ptr, row, stride_pr, n, in_range, page_size):
    """Cache slots (int64) of key positions n of page-table row `row` (0 where not in_range)."""
    page = tl.load(pt_ptr + row * stride_pr + n // page_size, mask=in_range, other=0)
    return page.to(tl.int64) * page_size + n % page_size


@triton.jit
def qk_scores(q, k_ptr, ks_ptr, slot, kvh, d, kv_ok, n_ok, stride_ks, stride_kh, stride_ss, qk_scale,
              DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr):
    """[rows of q, BLOCK_N] fp32 scores q·kᵀ·qk_scale (qk_scale carries log2 e) of kv head
    kvh at `slot`; masked keys read as 0."""
    k = tl.load(k_ptr + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=kv_ok, other=0.0)
    if FP8KV:
        k_sc = tl.load(ks_ptr + slot * stride_ss + kvh, mask=n_ok, other=0.0)
        s = mma(q, tl.trans(e4m3_to_f32(k, FP8HW).to(DTYPE)), tl.zeros([q.shape[0], slot.shape[0]], tl.float32),
                INTERP)
        s = s * (k_sc[None, :] * qk_scale)
    else:
        s = mma(q, tl.trans(k), tl.zeros([q.shape[0], slot.shape[0]], tl.float32), INTERP) * qk_scale
    return s


@triton.jit
def softmax_step(m, l, s, visible, EMPTY_ROWS: tl.constexpr):
    """Online softmax (base 2) over one block of scores: (new running max, new running
    sum, the old terms' rescale factor, the block's unnormalised probabilities).
    EMPTY_ROWS: a row may have seen no visible key yet (max -inf); it then keeps
    weights 0 and scale 1 instead of NaN."""
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    if EMPTY_ROWS:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.exp2(m - m_use)
    p = tl.exp2(s - m_use[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    return m_new, l, alpha, p


@triton.jit
def pv_accumulate(acc, alpha, p, v_ptr, vs_ptr, slot, kvh, d, kv_ok, n_ok, stride_vs, stride_vh, stride_ss,
                  DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr):
    """acc·alpha + P·V for the block's values, the probabilities rounded to DTYPE (fp8:
    after the value scales multiply them)."""
    v = tl.load(v_ptr + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=kv_ok, other=0.0)
    if FP8KV:
        v_sc = tl.load(vs_ptr + slot * stride_ss + kvh, mask=n_ok, other=0.0)
        acc = mma(round_to(p * v_sc[None, :], DTYPE, INTERP), e4m3_to_f32(v, FP8HW).to(DTYPE), acc * alpha[:, None],
                  INTERP)
    else:
        acc = mma(round_to(p, DTYPE, INTERP), v, acc * alpha[:, None], INTERP)
    return acc


@triton.jit
def sink_logit(sinks_ptr, head):
    """Query head `head`'s sink logit (fp32) in the kernels' base-2 units: s_h · log2 e."""
    return tl.load(sinks_ptr + head) * 1.4426950408889634
