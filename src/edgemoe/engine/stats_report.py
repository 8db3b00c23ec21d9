"""Engine statistics for the server: `Engine.stats()` → an `EngineStats` snapshot, and when to send one.

The engine loop sends a snapshot when the server asks (`StatsRequest`) and otherwise
at most every `STATS_INTERVAL_S` while something changed, plus once more after the
engine falls idle, so the server's view of the KV pool settles to the idle truth.
A request with `experts` turns on per-expert marking (`Engine.watch_experts`) for
`WATCH_LEASE_S`; every snapshot meanwhile carries the expert map, and when no such
request renewed the lease the marking stops (a closed live view costs nothing).
Torch-free: the loop also runs scripted stand-in engines in tests.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from edgemoe.messages import EngineStats, ExpertCacheStats, ExpertMap

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
WATCH_LEASE_S = 5.0  # per-expert marking stays on this long after the last request for it


class ExpertWatch(Protocol):
    """An engine that can mark per-expert activity (`Engine`); test doubles need not."""

    def watch_experts(self, on: bool) -> None: ...

    def expert_map(self) -> Mapping[str, Any] | None: ...

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss() -> int | None:
    """This process's resident memory in bytes (Linux), or None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def _expert_cache(moe: object) -> ExpertCacheStats | None:
    if not isinstance(moe, Mapping):
        return None
    by_layer = moe.get("hit_rate_by_layer") or []
    return ExpertCacheStats(
        hits=_int(moe.get("hits")),
        misses=_int(moe.get("misses")),
        experts_cpu=_int(moe.get("experts_cpu")),
        bytes_copied=_int(moe.get("bytes_copied")),
        tokens=_int(moe.get("tokens")),
        hit_rate_by_layer=[float(x) for x in by_layer],
        misses_per_token=float(moe.get("misses_per_token") or 0.0),
    )


def _plain(plan: object) -> dict[str, int | float | str | bool | None]:
    if not isinstance(plan, Mapping):
        return {}
    return {str(k): v for k, v in plan.items() if v is None or isinstance(v, (int, float, str, bool))}


def _expert_map(m: Mapping[str, Any] | None) -> ExpertMap | None:
    if not m:
        return None
    return ExpertMap(layers=list(m["layers"]), num_experts=int(m["num_experts"]), cells=list(m["cells"]))


def to_engine_stats(stats: Mapping[str, Any], experts: Mapping[str, Any] | None = None) -> EngineStats:
    """The boundary struct for one `Engine.stats()` dict (missing keys read as 0/None) and,
    while watched, its `Engine.expert_map()`."""
    prefix = stats.get("prefix_cache") or {}
    return EngineStats(
        time=time.time(),
        requests_running=_int(stats.get("requests_running")),
        requests_waiting=_int(stats.get("requests_waiting")),
        kv_pages_total=_int(stats.get("kv_pages_total")),
        kv_pages_free=_int(stats.get("kv_pages_free")),
        kv_pages_cached=_int(stats.get("kv_pages_cached")),
        kv_pages_evictable=_int(stats.get("kv_pages_evictable")),
        prefix_cache_queries=_int(prefix.get("queries")),
        prefix_cache_query_tokens=_int(prefix.get("query_tokens")),
        prefix_cache_hit_tokens=_int(prefix.get("hit_tokens")),
        moe_backend=stats.get("moe_backend") if isinstance(stats.get("moe_backend"), str) else None,
        expert_cache=_expert_cache(stats.get("moe")),
        memory_plan=_plain(stats.get("memory_plan")),
        device_memory_allocated=stats.get("device_memory_allocated"),
        device_memory_reserved=stats.get("device_memory_reserved"),
        host_memory_rss=host_rss(),
        experts=_expert_map(experts),
    )


class StatsReporter:
    """Decides when the loop sends a snapshot; `engine_stats` is the engine's `stats`
    method, or None for an engine without one (then nothing is ever sent); `experts` the
    engine again when it can mark per-expert activity."""

    def __init__(
        self, engine_stats: Callable[[], Mapping[str, Any]] | None, experts: ExpertWatch | None = None,
        interval_s: float = STATS_INTERVAL_S, lease_s: float = WATCH_LEASE_S,
    ) -> None:
        self._engine_stats = engine_stats
        self._experts = experts
        self.interval_s, self.lease_s = interval_s, lease_s
        self._last = float("-inf")
        self._changed = True  # the first snapshot goes out at once (memory plan, pool size)
        self._asked = False
        self._watch_until: float | None = None  # marking is on until then

    def ask(self, experts: bool = False, now: float | None = None) -> None:
        """The server wants a snapshot now (with the expert map: a live view watches)."""
        self._asked = True
        if experts and self._experts is not None:
            if self._watch_until is None:
                self._experts.watch_experts(True)
            self._watch_until = (time.monotonic() if now is None else now) + self.lease_s

    @property
    def watching(self) -> bool:
        return self._watch_until is not None

    def changed(self) -> None:
        """The engine did something since the last snapshot."""
        self._changed = True

    def due(self, now: float | None = None) -> EngineStats | None:
        """A snapshot to send now, or None."""
        if self._engine_stats is None:
            return None
        now = time.monotonic() if now is None else now
        if self._watch_until is not None and now > self._watch_until and self._experts is not None:
            self._experts.watch_experts(False)  # nobody asked for a while: stop marking
            self._watch_until = None
        if not (self._asked or (self._changed and now - self._last >= self.interval_s)):
            return None
        self._asked = self._changed = False
        self._last = now
        try:
            experts = self._experts.expert_map() if self.watching and self._experts is not None else None
            return to_engine_stats(self._engine_stats(), experts)
        except Exception:  # statistics must never take the engine down
            log.exception("engine statistics failed")
            return None
