"""MoE executors by name (`--moe-backend`), imported lazily."""

from __future__ import annotations

import torch

from edgemoe.kernels.moe_experts import Activation
from edgemoe.moe.executor import MoEExecutor
from edgemoe.moe.store import ExpertStore

EXECUTORS = ("resident", "offload", "cpu", "hybrid", "auto")
EXPERT_CACHES = ("host", "device")  # what `--expert-cache auto` resolves to: resolve_expert_cache


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
    expert_cache: str = "host",
    expert_mover: str = "gather",
) -> MoEExecutor:
    """The executor named by `--moe-backend`; `max_tokens` (the largest step) sizes the
    contribution-cell workspace. hybrid: `hybrid_fraction` fixes the CPU's share of the
    misses, None lets the live controller split them; auto: the controller also chooses
    between offload and hybrid (`top_k` sizes its start-up decision).

    `expert_cache` "device": the slot cache on the device (LRU only; offload, or auto when
    the experts don't fit: the device cache does not split misses with the CPU), misses
    moved by `expert_mover` ("gather" | "copy")."""
    if backend == "resident":
        from edgemoe.moe.executor import ResidentExecutor

        return ResidentExecutor(store, device, act, num_layers, max_tokens)
    if expert_cache == "device":
        check_device_cache(backend, policy)
        from edgemoe.moe.device_offload import DeviceOffloadExecutor

        return DeviceOffloadExecutor(store, device, act, num_layers, num_slots, expert_mover, max_tokens)
    if expert_cache != "host":
        raise ValueError(f"expert_cache {expert_cache!r}: choose one of {', '.join(EXPERT_CACHES)}")
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


def resolve_expert_cache(setting: str, device_type: str, backend: str, policy: str) -> str:
    """`--expert-cache auto`: device on a GPU when the backend is offload or auto and the
    policy LRU, else host. Measured at 16 GiB on the GPU machine (docs/benchmarks.md):
    decode steps in CUDA graphs with no host read per layer ran 184 tok/s where the host
    cache's per-layer reads held auto to 8.7; under heavy misses (synthetic routing, 113
    misses a token) 15.4 against 13.2. What it gives up is auto's CPU split: `--expert-cache
    host` (or --moe-backend hybrid) keeps it."""
    if setting != "auto":
        return setting
    on_device = device_type == "cuda" and backend in ("offload", "auto") and policy == "lru"
    return "device" if on_device else "host"


def check_device_cache(backend: str, policy: str) -> None:
    """Refuse what `--expert-cache device` can't run (torch-free, so the config checks it too)."""
    if backend in ("cpu", "hybrid"):
        raise ValueError(f"expert_cache (--expert-cache) device runs the offload backend, not {backend!r}: "
                         "cpu/hybrid read each layer's routing on the host (use --expert-cache host)")
    if policy != "lru":
        raise ValueError(f"expert_cache (--expert-cache) device evicts by LRU only (got --moe-policy {policy})")
