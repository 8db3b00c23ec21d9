"""Fill the expert cache's slot pool at start-up (`--expert-preload`).

A fresh engine's slots are empty, so its first prompt copies every expert it routes to:
a 512-token prompt routes to ~117 of a Qwen3-30B-A3B layer's 128 experts, and at 16 GiB
in fp8 it moved 26.5 GB before its first token, while 38% of the experts would have fit
in the slots from the start (llama.cpp's `--n-cpu-moe` deployments hold their GPU layers'
experts from load on). Preloading copies the pool full once, before the first request:
each layer gets an equal share of the slots (no routing is known yet, so every expert of
a layer is as likely as another), its experts spread evenly over the layer's ids.

Each layer's share is planned by the cache itself, as one wave routing those experts
(`DeviceSlotCache.plan_wave`; the host cache's `SlotCache.plan_layer`): the slot map,
owners, recency and the scan-resistant policy's layer clock end exactly as a real wave
leaves them — so the device and host caches stay decision for decision the same
(tests/moe/test_slot_preload.py) — and then the planned misses are copied from the
store. The wave's hit/miss counts and activity marks are undone: no request caused them.
The device cache fills only the slots below its lendable tail (a long prompt's loan would
empty the tail again).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.offload import SlotBanks
from edgemoe.moe.slots import SlotCache

if TYPE_CHECKING:
    from edgemoe.moe.device_offload import DeviceOffloadExecutor
    from edgemoe.moe.offload import OffloadExecutor

log = logging.getLogger(__name__)

PRELOAD_CHOICES = ("auto", "on", "off")


def preload_wanted(setting: str, store_kind: str) -> bool:
    """`--expert-preload`: on, off, or auto = on unless the store is mmap (its experts are
    read from disk on first touch: preloading would read GBs from disk at start-up)."""
    if setting not in PRELOAD_CHOICES:
        raise ValueError(f"expert_preload (--expert-preload) is one of {', '.join(PRELOAD_CHOICES)}, not {setting!r}")
    return setting == "on" or (setting == "auto" and store_kind != "mmap")


def layer_shares(num_slots: int, num_layers: int, num_experts: int) -> list[int]:
    """Slots each layer preloads: equal shares of `num_slots` (the first layers take the
    remainder), at most a layer's experts each."""
    base, extra = divmod(num_slots, num_layers)
    return [min(num_experts, base + (layer < extra)) for layer in range(num_layers)]


def spread_experts(count: int, num_experts: int) -> list[int]:
    """`count` distinct expert ids spread evenly over 0..num_experts-1."""
    return [i * num_experts // count for i in range(count)]


def layer_picks(layers: list[int], fill: int, num_experts: int) -> list[tuple[int, list[int]]]:
    """(layer, the experts it preloads) for each of `layers` with a share of `fill` slots."""
    shares = layer_shares(fill, len(layers), num_experts)
    return [(layer, spread_experts(n, num_experts)) for layer, n in zip(layers, shares, strict=True) if n]


def preload_pool(cache: DeviceSlotCache, slots: SlotBanks, layers: list[int], fill: int) -> int:
    """Plan and copy each of `layers`' share of the first `fill` slots (into an empty pool;
    a layer index is the cache's and the store's, as in the executor); returns the experts
    copied. The copies are issued on the current stream (it orders them before any step);
    the caller synchronises to time them."""
    if not 0 <= fill <= cache.num_slots:
        raise ValueError(f"cannot preload {fill} of {cache.num_slots} slots")
    counts, events, marks = cache.counts.clone(), cache.events.clone(), cache.mark_events
    cache.mark_events = False
    copied = 0
    try:
        for layer, experts in layer_picks(layers, fill, cache.num_experts):
            ids = torch.tensor(experts, dtype=torch.int32, device=cache.device)
            misses = cache.plan_wave(layer, ids.view(-1, 1)).misses.cpu()
            pairs = [(e, s) for e, s in zip(misses[0].tolist(), misses[1].tolist(), strict=True) if e >= 0]
            slots.copy_in(layer, pairs)
            copied += len(pairs)
    finally:
        cache.counts.copy_(counts)
        cache.events.copy_(events)
        cache.mark_events = marks
    return copied


def preload_host_pool(cache: SlotCache, slots: SlotBanks, layers: list[int], fill: int) -> int:
    """The same for the host cache (`--expert-cache host`): each layer's share planned by
    its `SlotCache` as routed experts, copied, released; its counters reset."""
    copied = 0
    for layer, experts in layer_picks(layers, fill, cache.num_experts):
        for wave in cache.plan_layer(layer, experts):
            slots.copy_in(layer, [(miss.expert, miss.slot) for miss in wave.misses])
            copied += len(wave.misses)
        cache.release_layer(layer)
    cache.reset_stats()
    return copied


def preload_executor(executor: OffloadExecutor | DeviceOffloadExecutor) -> int:
    """Preload an offload executor's pool (the device cache's below its lendable tail);
    logs the count, bytes and time."""
    from edgemoe.moe.device_offload import DeviceOffloadExecutor

    layers, start = list(executor.slots.store.layers), time.perf_counter()
    if isinstance(executor, DeviceOffloadExecutor):
        fill = executor.lending.first if executor.lending is not None else executor.cache.num_slots
        copied = preload_pool(executor.cache, executor.slots, layers, fill)
    else:
        copied = preload_host_pool(executor.cache, executor.slots, layers, executor.cache.num_slots)
        executor.mirror_map()
    if executor.slots.device.type == "cuda":
        torch.cuda.synchronize(executor.slots.device)
    seconds = time.perf_counter() - start
    executor.stats.info["preloaded_experts"] = copied
    log.warning("expert slots preloaded: %d experts (%.1f GB, ~%d a layer) in %.2f s (--expert-preload off: "
                "start empty)", copied, copied * executor.slots.expert_nbytes / 1e9, copied // len(layers), seconds)
    return copied


def has_pool(executor: object) -> bool:
    """Whether `executor` caches experts in a slot pool (offload, hybrid, cpu; either cache)."""
    from edgemoe.moe.device_offload import DeviceOffloadExecutor
    from edgemoe.moe.offload import OffloadExecutor

    return isinstance(executor, DeviceOffloadExecutor | OffloadExecutor)


def restart_pool(executor: object) -> None:
    """Put an offload executor's pool back as start-up left it — emptied, and preloaded again
    if it was — so a benchmark's warm-up request doesn't warm the cache its first measured
    prompt meets (a fresh server's first request sees the start-up pool). No-op without a pool."""
    if not has_pool(executor):
        return
    executor.recover()  # type: ignore[attr-defined]
    if "preloaded_experts" in executor.stats.info:  # type: ignore[attr-defined]
        preload_executor(executor)  # type: ignore[arg-type]


def preload_at_start(executor: object, setting: str, store_kind: str) -> None:
    """--expert-preload at engine build: fill the pool of an executor that has one."""
    if not preload_wanted(setting, store_kind):
        return
    if has_pool(executor):
        preload_executor(executor)  # type: ignore[arg-type]
    elif setting == "on":
        log.warning("--expert-preload on: no slot pool to fill (every expert is resident)")
