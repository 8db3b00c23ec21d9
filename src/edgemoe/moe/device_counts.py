"""The device expert cache's counts drained into `MoEStats` (`DeviceOffloadExecutor`'s
`stats.drains`): hits, misses and bytes counted on the device, the CPU share's experts and
its host function's timings — each read once, only when the statistics are asked for."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgemoe.moe.activity import HIT, MISS
from edgemoe.moe.cpu_share import CpuShare
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.stats import MoEStats


class DeviceCounts:
    """Drains `cache`'s counts and those of the share `share()` returns (None: no share,
    or not yet made) into the stats it is called with; remembers what it already moved."""

    def __init__(self, cache: DeviceSlotCache, expert_nbytes: int, share: Callable[[], CpuShare | None]) -> None:
        layers = cache.num_layers
        self.cache, self.expert_nbytes, self.share = cache, expert_nbytes, share
        self._seen = np.zeros((layers, 2), dtype=np.int64)  # device counts already drained
        self._seen_cpu = np.zeros(layers, dtype=np.int64)
        self._seen_busy = (0, 0)  # the host function's calls and ns already drained

    def __call__(self, stats: MoEStats) -> None:
        """Move the device counts into `stats` (one read each)."""
        counts = self.cache.read_counts()
        new, self._seen = counts - self._seen, counts
        for layer in np.flatnonzero(new.any(axis=1)):
            stats.hits[layer] += int(new[layer, 0])
            stats.misses[layer] += int(new[layer, 1])
        stats.bytes_copied += int(new[:, 1].sum()) * self.expert_nbytes
        share = self.share()
        if share is not None:  # CPU experts are misses too, computed where they are
            cpu = share.read_counts().numpy()
            new_cpu, self._seen_cpu = cpu - self._seen_cpu, cpu
            for layer in np.flatnonzero(new_cpu):
                stats.cpu_experts[layer] += int(new_cpu[layer])
                stats.misses[layer] += int(new_cpu[layer])
            self._drain_cpu_time(share, stats)
        events = self.cache.take_events()
        if stats.activity is not None:  # someone watches the live view
            stats.activity.mark_counts(events == HIT, HIT)
            stats.activity.mark_counts(events == MISS, MISS)

    def _drain_cpu_time(self, share: CpuShare, stats: MoEStats) -> None:
        """The host function's own timings into `cpu_s` / `cpu_calls` (the CPU side of the
        split; the device side is the step's remainder)."""
        busy = share.read_busy()
        if busy is None:
            return
        calls, ns = int(busy[0].sum()), int(busy[1].sum())
        seen_calls, seen_ns = self._seen_busy
        self._seen_busy = (calls, ns)
        stats.cpu_calls += calls - seen_calls
        stats.cpu_s += (ns - seen_ns) / 1e9
