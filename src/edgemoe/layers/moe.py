"""Sparse MoE block: a router (softmax top-k, with an optional logit bias (gpt-oss), or
sigmoid with a selection bias and groups: `kernels/router_sigmoid.py`), then the routed
experts via an executor."""

from __future__ import annotations

import torch

from edgemoe.env_switch import env_switch
from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.norm_fused import RowNorm, add_rms_norm
from edgemoe.kernels.router import (
    NormedRoute,
    add_norm_route,
    fused_router_workspace,
    route_logits_topk,
)
from edgemoe.kernels.router_sigmoid import SigmoidRouter, route_grouped_sigmoid, with_shared
from edgemoe.moe.executor import MoEExecutor


def router_norm_enabled() -> bool:
    """Whether MoE blocks run their residual add + norm inside the router's launch
    (`SparseMoE.add_norm_route`); `EDGEMOE_ROUTER_NORM=0` turns it off (A/B runs: the
    results are bitwise the same either way)."""
    return env_switch("EDGEMOE_ROUTER_NORM", True)


class SparseMoE:
    def __init__(
        self,
        layer: int,
        router: torch.Tensor,  # [E, H]
        top_k: int,
        norm_topk_prob: bool,
        executor: MoEExecutor,
        linear: Linear = dense_gemv_ref,  # the router's projection past the fused router's batches (--dense-kernel)
        sigmoid: SigmoidRouter | None = None,  # GLM's (or DeepSeek-V2's) router, `router` its weight; None: softmax
        router_bias: torch.Tensor | None = None,  # [E] added to a softmax router's logits (gpt-oss)
    ) -> None:
        self.layer, self.router, self.top_k = layer, router, top_k
        self.norm_topk_prob = norm_topk_prob
        self.executor, self.linear, self.sigmoid = executor, linear, sigmoid
        self.router_bias = router_bias
        # Static buffers of the fused router GEMV + top-k (None: the projection, then
        # `route_topk`); allocated here, before any CUDA graph captures the layer.
        self.workspace = fused_router_workspace(router, top_k) if sigmoid is None else None
        # A softmax ranks as its logits do (DeepSeek-V2: prefetch predicts by them); a selection bias
        # on its probabilities (ERNIE) does not: the prediction adds it to the softmax.
        if sigmoid is not None:
            softmax = sigmoid.spec.softmax
            executor.register_router(layer, router, sigmoid.bias, sigmoid=not softmax,
                                     softmax=softmax and sigmoid.bias is not None)
        else:
            executor.register_router(layer, router, router_bias)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] → (topk_ids [T, K] int32, topk_weights [T, K] fp32 holding values
        rounded to x's dtype, as transformers' router casts them). With the executor's
        routing override (cache studies) the ids are its, the weights the router's."""
        if self.sigmoid is not None:  # fp32 weights, unrounded (as transformers' sigmoid router)
            # The shared pair is appended in the routing's own launch, or after an override (it draws the routed ones).
            override = self.executor.routing is not None
            ids, weights = route_grouped_sigmoid(x, self.sigmoid, self.top_k, self.norm_topk_prob, shared=not override)
            return with_shared(*self._overridden(ids, weights), self.sigmoid.shared_id) if override else (ids, weights)
        ids, weights = route_logits_topk(  # [T, K] each
            x, self.router, self.top_k, self.norm_topk_prob, x.dtype, self.workspace, self.linear, self.router_bias,
        )
        return self._overridden(ids, weights)

    def add_norm_route(self, a: torch.Tensor, residual: torch.Tensor, norm: RowNorm) -> NormedRoute:
        """The block's residual add and `norm` in front of this router, routed as `route`
        routes: x = norm(residual + a), h = residual + a; on a GPU one launch does all
        (`kernels/router.py` `add_norm_route`; a sigmoid router: the add and norm, then
        `route`). Pass (ids, weights) on as `routing`."""
        if self.sigmoid is not None:
            x, h = add_rms_norm(a, residual, norm.weight, norm.eps, norm.weight_offset)
            return NormedRoute(x, h, *self.route(x))
        out = add_norm_route(
            a, residual, norm, self.router, self.top_k, self.norm_topk_prob, a.dtype, self.workspace, self.linear,
            self.router_bias,
        )
        ids, weights = self._overridden(out.ids, out.weights)
        return out._replace(ids=ids, weights=weights)

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, num_decode: int = 0, num_padding: int = 0,
        routing: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The routed experts' sum for x [T, H] (plus `residual`, fused, when given);
        `num_decode`: the leading rows that are decode tokens; `num_padding`: trailing
        rows that only pad the batch (their output is never read); `routing`: x's
        (ids, weights) when `add_norm_route` made them (else routed here)."""
        ids, weights = self._traced_route(x, routing)
        return self.executor.forward(self.layer, x, ids, weights, residual, num_decode, num_padding)

    def call_normed(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RowNorm, num_decode: int = 0, num_padding: int = 0,
        routing: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, norm(h)) with h = self(x, residual, ...): the next layer's input norm
        too, fused into the executor's combine where it can (`forward_normed`)."""
        ids, weights = self._traced_route(x, routing)
        return self.executor.forward_normed(self.layer, x, ids, weights, residual, norm, num_decode, num_padding)

    def _overridden(self, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        override = self.executor.routing
        if override is not None:
            ids = override.ids(self.layer, ids).to(torch.int32)
        return ids, weights

    def _traced_route(
        self, x: torch.Tensor, routing: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids, weights = self.route(x) if routing is None else routing
        if self.executor.trace is not None and self.executor.routing is None:  # an override records its own draws
            self.executor.trace.record(self.layer, ids)
        return ids, weights
