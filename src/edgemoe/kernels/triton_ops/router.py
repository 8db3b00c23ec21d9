"""Softmax + top-k + renormalisation, one program per token (see `kernels/router.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import interpreting, round_to, tl_dtype


@triton.jit
def _route_topk(
    logits_ptr, ids_ptr, w_ptr, E, stride_lt, stride_it, stride_wt,
    K: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    x = tl.load(logits_ptr + t * stride_lt + e, mask=e < E, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)  # softmax in fp32, as torch.softmax(dtype=float32)
    k = tl.arange(0, K)
    top_w = tl.zeros([K], tl.float32)
    top_i = tl.zeros([K], tl.int32)
    remaining = tl.where(e < E, p, -1.0)
    for j in tl.static_range(K):  # the j-th largest; ties go to the lower expert id
        best = tl.max(remaining, axis=0)
        idx = tl.min(tl.where(remaining == best, e, E_PAD), axis=0)
        top_w = tl.where(k == j, best, top_w)
        top_i = tl.where(k == j, idx, top_i)
        remaining = tl.where(e == idx, -1.0, remaining)
    if RENORM:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(ids_ptr + t * stride_it + k, top_i)
    tl.store(w_ptr + t * stride_wt + k, round_to(top_w, DTYPE, INTERP).to(tl.float32))


def route_topk_triton(
    logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    if top_k & (top_k - 1):
        raise ValueError(f"top_k {top_k}: the fused router needs a power of two")
    ids = torch.empty(T, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    if T == 0:
        return ids, weights
    logits = logits.contiguous()
    _route_topk[(T,)](
        logits, ids, weights, E, logits.stride(0), ids.stride(0), weights.stride(0),
        K=top_k, E_PAD=triton.next_power_of_2(E), RENORM=renormalize, DTYPE=tl_dtype(dtype),
        INTERP=interpreting(logits), num_warps=4 if E > 256 else 2,
    )
    return ids, weights
