"""MoE routing: softmax over the experts, top-k, optional renormalisation, in one step;
and the router's projection fused with it for decode batches.

`route_topk(logits, top_k, renormalize, dtype)` → (ids [T, K] int32, weights [T, K]
fp32 holding values rounded to `dtype`). The reference is transformers' Qwen3-MoE /
Mixtral router: softmax in fp32, top-k, weights / their sum when `renormalize`, cast
to the hidden dtype (the slot kernels multiply in fp32 by that rounded weight). On a
GPU one Triton program per token replaces the ~7 small kernels the reference launches;
its fp32 exp may differ from torch's in the last bit, so a near-tie between the k-th and
(k+1)-th expert may resolve differently (a token's choice never depends on its batch).

`route_logits_topk(x, router, ...)`: the same from the hidden states, logits = x @ W.T
(+ the router's bias, gpt-oss's) rounded to x's dtype (`F.linear`). For batches of at most `FUSED_MAX_TOKENS` tokens on a
GPU (whatever `--dense-kernel` says), with a `RouterWorkspace`, one Triton launch computes the logits and routes
(`triton_ops/router.py`): it replaces the router GEMV (~5 µs of latency for a 0.5 MB
weight) and `route_topk`'s launch. Larger batches (prefill) take the projection and
`route_topk`: a fused program per token re-reads the whole weight, T times, where a GEMM
reads it once. Both paths route equal logits identically (one shared Triton helper);
their logits are the same sums in other orders, so they agree to one rounding of x's dtype.

`add_norm_route(a, residual, norm, router, ...)` → `NormedRoute(x, h, ids, weights)`: the
layer's residual add and RMSNorm in front of its router (h = residual + a, x = norm(h),
`norm_fused.add_rms_norm`), then `route_logits_topk(x, ...)`. Where the fused router runs
(a workspace, the batch fits it, CUDA, one activation dtype) the norm runs inside that
same launch: x and h are bitwise `add_rms_norm`'s Triton kernel's, the logits, ids and
weights bitwise `route_logits_topk`'s from that x. Elsewhere: the two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.dense_gemv import MAX_TOKENS, Linear, dense_gemv_ref
from edgemoe.kernels.norm_fused import RowNorm, add_rms_norm, add_rms_norm_ref

# NOTE: the decode path's skinny-GEMM limit, so a batch's router and its other projections
# switch to cuBLAS at the same size (and every captured decode size, up to the default
# cuda_graph_max_bs = 32, routes in one launch). At 32 tokens the fused kernel reads
# 32 x 0.5 MB of weight (from L2 after the first token); far beyond, one GEMM wins.
FUSED_MAX_TOKENS = MAX_TOKENS


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
    if not use_triton(logits, dtype):
        return route_topk_ref(logits, top_k, renormalize, dtype)
    from edgemoe.kernels.triton_ops.router import route_topk_triton

    return route_topk_triton(logits, top_k, renormalize, dtype)


@dataclass(frozen=True)
class RouterWorkspace:
    """The fused router's static buffers on one device: `logits` [max_tokens, E] fp32
    (each launch's logits, x's dtype's values) and `arrivals` [max_tokens] int32, the
    per-token count of programs done.

    NOTE: `arrivals` is zero between launches (zeroed here, reset by each launch), so a
    CUDA graph can capture the launch; launches that share a workspace must be ordered
    (one stream), as a model's layers are."""

    logits: torch.Tensor
    arrivals: torch.Tensor

    @classmethod
    def allocate(cls, experts: int, device: torch.device, max_tokens: int = FUSED_MAX_TOKENS) -> RouterWorkspace:
        return cls(
            torch.zeros(max_tokens, experts, dtype=torch.float32, device=device),
            torch.zeros(max_tokens, dtype=torch.int32, device=device),
        )

    @property
    def max_tokens(self) -> int:
        return self.arrivals.shape[0]


def fused_router_workspace(router: torch.Tensor, top_k: int) -> RouterWorkspace | None:
    """A workspace when the fused router can run for this router: on a GPU with Triton,
    the router in bf16/fp16 (any top_k: Qwen3.8's 10 of 512 too). Whatever
    `--dense-kernel` says: measured on an H200 (2026-12-01, CUDA graphs, E = 128,
    H = 2048) one launch takes 5.3 / 5.7 / 8.8 µs at 1 / 8 / 32 tokens where cuBLAS's
    GEMV then `route_topk` take 8.7 / 9.1 / 9.2; `EDGEMOE_TRITON=0` keeps the reference."""
    if not use_triton(router):
        return None
    return RouterWorkspace.allocate(router.shape[0], router.device)


def route_logits_topk_ref(
    x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], router [E, H] → `route_topk_ref` of the logits x @ W.T (+ `bias` [E], gpt-oss's:
    `F.linear`'s, rounded once) in x's dtype."""
    return route_topk_ref(_logits(x, router, bias, dense_gemv_ref), top_k, renormalize, dtype)


def _logits(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor | None, linear: Linear) -> torch.Tensor:
    """The router's logits in x's dtype: `linear`'s, or with a bias cuBLAS's `F.linear`."""
    return linear(x, router) if bias is None else F.linear(x, router, bias)


def route_logits_topk(
    x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype,
    workspace: RouterWorkspace | None = None, linear: Linear = dense_gemv_ref, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract of `route_logits_topk_ref`. One fused launch when `workspace` is given and
    the batch fits it (CUDA, bf16/fp16); else `route_topk(linear(x, router), ...)`."""
    T = x.shape[0]
    if workspace is not None and x.dim() == 2 and 0 < T <= workspace.max_tokens and use_triton(x, dtype):
        from edgemoe.kernels.triton_ops.router import route_logits_topk_triton

        return route_logits_topk_triton(x, router, top_k, renormalize, dtype, workspace.logits, workspace.arrivals,
                                        bias)
    return route_topk(_logits(x, router, bias, linear), top_k, renormalize, dtype)


class NormedRoute(NamedTuple):
    """A layer's MoE input and routing: x = norm(h) [T, H], h = residual + a [T, H] (the
    new residual), ids [T, K] int32, weights [T, K] fp32 (`route_topk`'s contract)."""

    x: torch.Tensor
    h: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor


def add_norm_route_ref(
    a: torch.Tensor, residual: torch.Tensor, norm: RowNorm, router: torch.Tensor, top_k: int, renormalize: bool,
    dtype: torch.dtype, bias: torch.Tensor | None = None,
) -> NormedRoute:
    """`add_rms_norm_ref` of (a, residual), then `route_logits_topk_ref` of the normed rows."""
    x, h = add_rms_norm_ref(a, residual, norm.weight, norm.eps, norm.weight_offset)
    return NormedRoute(x, h, *route_logits_topk_ref(x, router, top_k, renormalize, dtype, bias))


def add_norm_route(
    a: torch.Tensor, residual: torch.Tensor, norm: RowNorm, router: torch.Tensor, top_k: int, renormalize: bool,
    dtype: torch.dtype, workspace: RouterWorkspace | None = None, linear: Linear = dense_gemv_ref,
    bias: torch.Tensor | None = None,
) -> NormedRoute:
    """Contract of `add_norm_route_ref`. One fused launch where `route_logits_topk` would
    take its fused launch and a, residual and the norm's weight share x's dtype; else
    `add_rms_norm` then `route_logits_topk` (bitwise the launch's results either way)."""
    T = a.shape[0]
    if (
        workspace is not None and a.dim() == 2 and 0 < T <= workspace.max_tokens and use_triton(a, dtype)
        and residual.dtype == a.dtype and norm.weight.dtype == a.dtype
    ):
        from edgemoe.kernels.triton_ops.router import add_norm_route_triton

        return NormedRoute(*add_norm_route_triton(
            a, residual, norm.weight, norm.eps, norm.weight_offset, router, top_k, renormalize, dtype,
            workspace.logits, workspace.arrivals, bias,
        ))
    x, h = add_rms_norm(a, residual, norm.weight, norm.eps, norm.weight_offset)
    return NormedRoute(x, h, *route_logits_topk(x, router, top_k, renormalize, dtype, workspace, linear, bias))
