"""MoE executors: given a layer's routing, compute its routed experts.

Executors differ only in *where* an expert's weights are when it runs (all on the
device, a slot cache fed over PCIe, the host CPU, or a mix). They share the kernels in
`kernels/moe_experts.py`, so every residency gives the same numbers on one device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from edgemoe.kernels.moe_experts import Activation, moe_combine, moe_experts_partial
from edgemoe.moe.store import ExpertStore


class MoEExecutor(ABC):
    """Contract: `forward(layer, x, topk_ids, topk_weights)` returns
    sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) as [T, H] in x's dtype.
    Called once per MoE layer per step, in layer order; `x` and the routing are only
    valid for the duration of the call. Executors may keep state across calls (a
    cache), but the result never depends on it."""

    @abstractmethod
    def forward(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor: ...

    def close(self) -> None:
        """Release device memory and threads."""


class ResidentExecutor(MoEExecutor):
    """Every expert of every layer on the compute device."""

    def __init__(self, store: ExpertStore, device: torch.device, act: Activation) -> None:
        self.act = act
        self.banks = {
            i: (b.gate_up.to(device), b.down.to(device)) for i, b in store.banks.items()
        }

    def forward(self, layer, x, topk_ids, topk_weights):  # type: ignore[override]
        gate_up, down = self.banks[layer]
        experts = sorted(set(topk_ids.flatten().tolist()))
        contrib = torch.zeros(*topk_ids.shape, x.shape[-1], dtype=torch.float32, device=x.device)
        moe_experts_partial(x, topk_ids, topk_weights, experts, experts, gate_up, down, self.act, contrib)
        return moe_combine(contrib, x.dtype)

    def close(self) -> None:
        self.banks.clear()
