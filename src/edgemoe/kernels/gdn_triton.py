"""The recurrent gated delta rule as one Triton kernel that updates state pool rows in place:
the decode step's GDN core, shaped to live inside a CUDA graph.

One program per (sequence, value head, block of BV value columns): it reads its [Dk, BV] slice of
pool row `state_idx[b]` once, steps through the sequence's tokens (one for decode), and writes
the slice back — no gather/scatter copies of the 2 MiB-per-sequence state (fla's recurrent
kernel needs both around it), no host sync, a fixed launch: capturable. Same signature and
contract as `gdn.recurrent_gated_delta_rule_ref`. `triton` is imported when this module is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.gdn import L2NORM_EPS

BLOCK_V = 8  # value columns per program: many small programs keep the state reads spread over the SMs


@triton.jit
def _delta_step(s, q, k, v, g, beta, o, t, i_hk, i_hv, o_k, o_v, m_k, m_v, scale, eps,
                stride_q, stride_k, stride_v, stride_g, stride_beta,
                HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L2NORM: tl.constexpr):
    """Token t for one (value head, value block): returns the updated state slice."""
    b_q = tl.load(q + t * stride_q + i_hk * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + t * stride_k + i_hk * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + t * stride_v + i_hv * DV + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_g = tl.load(g + t * stride_g + i_hv).to(tl.float32)
    b_beta = tl.load(beta + t * stride_beta + i_hv).to(tl.float32)
    if L2NORM:
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + eps)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + eps)
    s = s * tl.exp(b_g)
    correction = b_beta * (b_v - tl.sum(s * b_k[:, None], 0))  # beta (v - Sᵀk)
    s = s + b_k[:, None] * correction[None, :]
    b_o = tl.sum(s * (b_q * scale)[:, None], 0)
    tl.store(o + (t * HV + i_hv) * DV + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    return s


@triton.jit
def _gdn_recurrent_kernel(
    q, k, v, g, beta, o, pool, state_idx, has_init, cu_seqlens, scale, eps,
    stride_q, stride_k, stride_v, stride_g, stride_beta,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    L2NORM: tl.constexpr, HAS_INIT_MASK: tl.constexpr, VARLEN: tl.constexpr,
):
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_hk = i_hv // (HV // HK)  # key head i serves value heads i*r .. i*r+r-1
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_s = m_k[:, None] & m_v[None, :]
    row = tl.load(state_idx + i_b).to(tl.int64)  # int64: row * Hv * Dk * Dv passes 2^31 in big pools
    p_s = pool + ((row * HV + i_hv) * DK + o_k[:, None]) * DV + o_v[None, :]
    s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)
    if HAS_INIT_MASK:
        s = tl.where(tl.load(has_init + i_b) != 0, s, 0.0)  # a select: an unread row may hold NaN
    if VARLEN:
        bos = tl.load(cu_seqlens + i_b).to(tl.int64)
        eos = tl.load(cu_seqlens + i_b + 1).to(tl.int64)
        for t in range(bos, eos):
            s = _delta_step(s, q, k, v, g, beta, o, t, i_hk, i_hv, o_k, o_v, m_k, m_v, scale, eps,
                            stride_q, stride_k, stride_v, stride_g, stride_beta, HV, DK, DV, L2NORM)
    else:  # one token per sequence: token i_b, cu_seqlens not read
        s = _delta_step(s, q, k, v, g, beta, o, i_b.to(tl.int64), i_hk, i_hv, o_k, o_v, m_k, m_v, scale, eps,
                        stride_q, stride_k, stride_v, stride_g, stride_beta, HV, DK, DV, L2NORM)
    tl.store(p_s, s.to(pool.dtype.element_ty), mask=m_s)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """A [T, H, D] view whose heads and features are dense (a split of a wider row is fine)."""
    return x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()


def recurrent_gated_delta_rule_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_idx: torch.Tensor, *,
    has_initial_state: torch.Tensor | None = None, use_qk_l2norm: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """Decode (one or a few tokens per sequence); pool rows updated in place. With one token per
    sequence (T == B) `cu_seqlens` is not read."""
    tokens, hk, dk = k.shape
    hv, dv = v.shape[1:]
    batch = state_idx.numel()
    if not state_pool.is_contiguous() or hv % hk:
        raise ValueError("state_pool must be contiguous [N, Hv, Dk, Dv] and Hv a multiple of Hk")
    q, k, v = _rows(q), _rows(k), _rows(v)
    o = torch.empty((tokens, hv, dv), dtype=q.dtype, device=q.device)
    has_init = has_initial_state if has_initial_state is not None else state_idx  # placeholder, not read
    grid = (batch * hv, triton.cdiv(dv, BLOCK_V))
    _gdn_recurrent_kernel[grid](
        q, k, v, g, beta, o, state_pool, state_idx, has_init, cu_seqlens,
        dk**-0.5 if scale is None else scale, L2NORM_EPS,
        q.stride(0), k.stride(0), v.stride(0), g.stride(0), beta.stride(0),
        HK=hk, HV=hv, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=BLOCK_V,
        L2NORM=use_qk_l2norm, HAS_INIT_MASK=has_initial_state is not None, VARLEN=tokens != batch,
        num_warps=1,
    )
    return o
