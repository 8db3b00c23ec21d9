"""MoE routing: softmax over the experts, top-k, optional renormalisation, in one step.

`route_topk(logits, top_k, renormalize, dtype)` → (ids [T, K] int32, weights [T, K]
fp32 holding values rounded to `dtype`). The reference is transformers' Qwen3-MoE /
Mixtral router: softmax in fp32, top-k, weights / their sum when `renormalize`, cast
to the hidden dtype (the slot kernels multiply in fp32 by that rounded weight). On a
GPU one Triton program per token replaces the ~7 small kernels the reference launches;
its fp32 exp may differ from torch's in the last bit, so a near-tie between the k-th and
(k+1)-th expert may resolve differently (a token's choice never depends on its batch).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.backend import use_triton


def route_topk_ref(
    logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids.to(torch.int32), weights.to(dtype).float()


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `route_topk_ref`; one fused kernel on CUDA."""
    if not use_triton(logits, dtype) or top_k & (top_k - 1):  # the kernel's k-range: a power of two
        return route_topk_ref(logits, top_k, renormalize, dtype)
    from edgemoe.kernels.triton_ops.router import route_topk_triton

    return route_topk_triton(logits, top_k, renormalize, dtype)
