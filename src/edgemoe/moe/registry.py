"""MoE executors by name (`--moe-backend`), imported lazily."""

from __future__ import annotations

import torch

from edgemoe.kernels.moe_experts import Activation
from edgemoe.moe.executor import MoEExecutor
from edgemoe.moe.store import ExpertStore

EXECUTORS = ("resident", "offload", "cpu", "hybrid", "auto")


def make_executor(
    backend: str,
    store: ExpertStore,
    device: torch.device,
    act: Activation,
    num_layers: int,
    num_slots: int,
    policy: str = "lru",
    hybrid_fraction: float | None = None,
    max_tokens: int = 256,
    top_k: int | None = None,
) -> MoEExecutor:
    """The executor named by `--moe-backend`; `max_tokens` (the largest step) sizes the
    contribution-cell workspace. hybrid: `hybrid_fraction` fixes the CPU's share of the
    misses, None lets the live controller split them; auto: the controller also chooses
    between offload and hybrid (`top_k` sizes its start-up decision)."""
    if backend == "resident":
        from edgemoe.moe.executor import ResidentExecutor

        return ResidentExecutor(store, device, act, num_layers, max_tokens)
    if backend == "offload":
        from edgemoe.moe.offload import OffloadExecutor

        return OffloadExecutor(store, device, act, num_layers, num_slots, policy, max_tokens)
    if backend in ("cpu", "hybrid", "auto"):
        from edgemoe.moe.cpu import SplitExecutor

        fraction = 1.0 if backend == "cpu" else hybrid_fraction if backend == "hybrid" else None
        mode = "auto" if backend == "auto" else "hybrid"
        return SplitExecutor(
            store, device, act, num_layers, num_slots, fraction, backend == "cpu", policy, max_tokens, mode, top_k
        )
    raise ValueError(f"moe_backend {backend!r}: choose one of {', '.join(EXECUTORS)}")
