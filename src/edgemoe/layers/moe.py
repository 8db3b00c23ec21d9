"""Sparse MoE block: a softmax top-k router, then the routed experts via an executor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.moe.executor import MoEExecutor


class SparseMoE:
    def __init__(
        self,
        layer: int,
        router: torch.Tensor,  # [E, H]
        top_k: int,
        norm_topk_prob: bool,
        executor: MoEExecutor,
    ) -> None:
        self.layer, self.router, self.top_k = layer, router, top_k
        self.norm_topk_prob = norm_topk_prob
        self.executor = executor

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] → (topk_ids [T, K], topk_weights [T, K] in x's dtype). With the
        executor's routing override (cache studies) the ids are its, the weights the router's."""
        logits = F.linear(x, self.router)  # [T, E]
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        override = self.executor.routing
        if override is not None:
            ids = override.ids(self.layer, ids)
        return ids, weights.to(x.dtype)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The routed experts' sum for x [T, H] (plus `residual`, fused, when given)."""
        ids, weights = self.route(x)
        if self.executor.trace is not None:
            self.executor.trace.record(self.layer, ids)
        return self.executor.forward(self.layer, x, ids, weights, residual)
