"""MoE executors by name (`--moe-backend`), imported lazily."""

from __future__ import annotations

import logging

import torch

from edgemoe.kernels.moe_experts import Activation
from edgemoe.moe.cache_choice import EXPERT_CACHES, check_device_cache
from edgemoe.moe.executor import MoEExecutor
from edgemoe.moe.store import ExpertStore

EXECUTORS = ("resident", "offload", "cpu", "hybrid", "auto")

log = logging.getLogger(__name__)


def live_share(backend: str, device: torch.device) -> str | None:
    """Whether a device-cache executor without a fixed quota gets a live CPU share: hybrid
    always (it asked for the CPU), auto on a GPU (on a CPU-only machine the experts are
    host memory either way)."""
    if backend == "hybrid" or (backend == "auto" and device.type == "cuda"):
        return backend
    return None


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
    cpu_experts_per_layer: int | None = None,
    prompt_cpu: bool | None = False,
    stream_tokens: int | None = None,
    lend_slots: int = 0,
    planned_tokens: int | None = None,
) -> MoEExecutor:
    """The executor named by `--moe-backend`; `max_tokens` (the largest step) sizes the
    contribution-cell workspace. hybrid: `hybrid_fraction` fixes the CPU's share of the
    misses, None lets the live controller split them; auto: the controller also chooses
    between offload and hybrid (`top_k` sizes its start-up decision).

    `expert_cache` "device": the slot cache on the device ("lru" or "lru-plain"), misses moved
    by `expert_mover` ("gather" | "copy"); hybrid and auto add the CPU share (fixed by a quota
    `cpu_experts_per_layer` and/or hybrid's `hybrid_fraction` of each layer's misses, or a
    live one: `live_share` says when), and
    `prompt_cpu` its prompt rule (None: wherever the share runs); prompt chunks of `stream_tokens` or more (default
    `moe/prefill_stream.py`'s) stream their experts, with the last `lend_slots` slots'
    memory lent to them (`moe/slot_lending.py`; the memory plan's `lend_slots`; the
    persistent cells sized for `planned_tokens`, the largest step that doesn't borrow)."""
    if backend == "resident":
        from edgemoe.moe.executor import ResidentExecutor

        return ResidentExecutor(store, device, act, num_layers, max_tokens)
    if expert_cache == "device":
        check_device_cache(backend, policy)
        from edgemoe.moe.device_offload import DeviceOffloadExecutor

        quota = cpu_experts_per_layer if backend == "hybrid" else None
        fraction = hybrid_fraction if backend == "hybrid" else None
        live = live_share(backend, device) if quota is None and fraction is None else None
        return DeviceOffloadExecutor(store, device, act, num_layers, num_slots, expert_mover, max_tokens, quota,
                                     cpu_fraction=fraction, policy=policy, live_quota=live, top_k=top_k,
                                     prompt_cpu=prompt_cpu,
                                     stream_tokens=stream_tokens, lend_slots=lend_slots,
                                     planned_tokens=planned_tokens)
    if expert_cache != "host":
        raise ValueError(f"expert_cache {expert_cache!r}: choose one of {', '.join(EXPERT_CACHES)}")
    if prompt_cpu:
        log.warning("--prompt-cpu: the host expert cache has no CPU share inside the step; prompt chunks copy "
                    "their misses (the device cache, on a GPU, has it)")
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
