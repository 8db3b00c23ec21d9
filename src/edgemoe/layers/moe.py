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
        """x [T, H] → (topk_ids [T, K], topk_weights [T, K] in x's dtype)."""
        logits = F.linear(x, self.router)  # [T, E]
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(x.dtype)

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, num_decode: int = 0, num_padding: int = 0
    ) -> torch.Tensor:
        """The routed experts' sum for x [T, H] (plus `residual`, fused, when given);
        `num_decode`: the leading rows that are decode tokens; `num_padding`: trailing
        rows that only pad the batch (their output is never read)."""
        ids, weights = self.route(x)
        return self.executor.forward(self.layer, x, ids, weights, residual, num_decode, num_padding)
