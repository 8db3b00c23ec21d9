"""MoE executors: given a layer's routing, compute its routed experts.

Executors differ only in *where* an expert's weights are when it runs: all on the
device (resident), a slot cache fed from host memory (offload), the host CPU for
misses (cpu), or misses split between the two (hybrid). They share the kernels in
`kernels/moe_experts.py`, so every residency gives the same numbers on one device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from edgemoe.kernels.moe_experts import Activation, moe_combine, moe_experts_partial
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import ExpertStore


class MoEExecutor(ABC):
    """Contract: `forward(layer, x, topk_ids, topk_weights)` returns
    sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) as [T, H] in x's dtype.

    Called once per MoE layer per step, in layer order, from the engine's forward
    thread only; `x` and the routing are valid only during the call. Executors keep
    state across calls (a cache, statistics) but the result never depends on it.
    `close()` releases device memory and threads; the executor is unusable after.
    """

    stats: MoEStats

    @abstractmethod
    def forward(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor: ...

    def recover(self) -> None:
        """Forget per-step state after a forward aborted midway (device OOM)."""

    def close(self) -> None:
        """Release device memory and threads."""


def routed_experts(topk_ids: torch.Tensor) -> list[int]:
    """Distinct expert ids of a routing, ascending (one device→host sync)."""
    return torch.unique(topk_ids).tolist()


def new_contrib(topk_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-(token, k) fp32 contribution cells [T, K, H], zero-filled."""
    return torch.zeros(*topk_ids.shape, x.shape[-1], dtype=torch.float32, device=x.device)


class ResidentExecutor(MoEExecutor):
    """Every expert of every layer on the compute device."""

    def __init__(self, store: ExpertStore, device: torch.device, act: Activation, num_layers: int) -> None:
        self.act = act
        self.banks = {i: tuple(t.to(device) for t in store.layer_banks(i)) for i in store.layers}
        self.stats = MoEStats(num_layers, first_layer=store.layers[0])

    def forward(self, layer, x, topk_ids, topk_weights):  # type: ignore[override]
        gate_up, down = self.banks[layer]
        experts = routed_experts(topk_ids)
        self.stats.hits[layer] += len(experts)
        self.stats.count_tokens(layer, x.shape[0])
        contrib = new_contrib(topk_ids, x)
        moe_experts_partial(x, topk_ids, topk_weights, experts, experts, gate_up, down, self.act, contrib)
        return moe_combine(contrib, x.dtype)

    def close(self) -> None:
        self.banks.clear()


EXECUTORS = ("resident", "offload", "cpu", "hybrid")


def make_executor(
    backend: str,
    store: ExpertStore,
    device: torch.device,
    act: Activation,
    num_layers: int,
    num_slots: int,
    policy: str = "lru",
    hybrid_fraction: float = 0.5,
) -> MoEExecutor:
    """The executor named by `--moe-backend` (imports lazily)."""
    if backend == "resident":
        return ResidentExecutor(store, device, act, num_layers)
    if backend == "offload":
        from edgemoe.moe.offload import OffloadExecutor

        return OffloadExecutor(store, device, act, num_layers, num_slots, policy)
    if backend in ("cpu", "hybrid"):
        from edgemoe.moe.cpu import SplitExecutor

        fraction = 1.0 if backend == "cpu" else hybrid_fraction
        return SplitExecutor(store, device, act, num_layers, num_slots, fraction, backend == "cpu", policy)
    raise ValueError(f"moe_backend {backend!r}: choose one of {', '.join(EXECUTORS)}")
