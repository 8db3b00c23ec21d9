"""MoE executors by name (`--moe-backend`), imported lazily."""

from __future__ import annotations

import torch

from edgemoe.kernels.moe_experts import Activation
from edgemoe.moe.executor import MoEExecutor
from edgemoe.moe.store import ExpertStore

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
    max_tokens: int = 256,
) -> MoEExecutor:
    """The executor named by `--moe-backend`; `max_tokens` (the largest step) sizes the
    contribution-cell workspace."""
    if backend == "resident":
        from edgemoe.moe.executor import ResidentExecutor

        return ResidentExecutor(store, device, act, num_layers, max_tokens)
    if backend == "offload":
        from edgemoe.moe.offload import OffloadExecutor

        return OffloadExecutor(store, device, act, num_layers, num_slots, policy, max_tokens)
    if backend in ("cpu", "hybrid"):
        from edgemoe.moe.cpu import SplitExecutor

        fraction = 1.0 if backend == "cpu" else hybrid_fraction
        return SplitExecutor(store, device, act, num_layers, num_slots, fraction, backend == "cpu", policy, max_tokens)
    raise ValueError(f"moe_backend {backend!r}: choose one of {', '.join(EXECUTORS)}")
