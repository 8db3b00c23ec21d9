"""A line about the engine every ~10 s while there is traffic, like vLLM's:

    edgemoe: engine: prompt 812.4 tok/s, generation 57.9 tok/s | 2 running, 1 queued | KV 12.5% used | prefix cache 83.1% hit | expert cache 95.2% hit

Throughput is over the interval since the last line (the request tracker's totals);
running/queued are the server's counts; KV use and the cache hit rates come from the
engine's latest `EngineStats` snapshot, the hit rates over the interval (cumulative
until two snapshots differ). Logged on `edgemoe.stats` at INFO; `--quiet` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from edgemoe.messages import EngineStats
from edgemoe.server.state import ServerState

log = logging.getLogger("edgemoe.stats")

INTERVAL_S = 10.0


@dataclass(frozen=True)
class Sample:
    """What the line compares between two moments."""

    time: float
    prompt_tokens: int
    generation_tokens: int
    stats: EngineStats | None


def _rate(hits: int, total: int) -> str:
    return f"{100.0 * hits / total:.1f}%" if total > 0 else "-"


def engine_line(prev: Sample, now: Sample, running: int, queued: int) -> str:
    seconds = max(now.time - prev.time, 1e-9)
    parts = [
        f"prompt {(now.prompt_tokens - prev.prompt_tokens) / seconds:.1f} tok/s, "
        f"generation {(now.generation_tokens - prev.generation_tokens) / seconds:.1f} tok/s",
        f"{running} running, {queued} queued",
    ]
    s, p = now.stats, prev.stats
    if s is not None:
        if s.kv_pages_total:
            used = s.kv_pages_total - s.kv_pages_free - s.kv_pages_evictable
            parts.append(f"KV {100.0 * used / s.kv_pages_total:.1f}% used")
        hits, queried = s.prefix_cache_hit_tokens, s.prefix_cache_query_tokens
        if p is not None and queried > p.prefix_cache_query_tokens:
            hits, queried = hits - p.prefix_cache_hit_tokens, queried - p.prefix_cache_query_tokens
        parts.append(f"prefix cache {_rate(hits, queried)} hit")
        if s.expert_cache is not None:
            e, pe = s.expert_cache, p.expert_cache if p is not None else None
            ehits, euses = e.hits, e.hits + e.misses
            if pe is not None and euses > pe.hits + pe.misses:
                ehits, euses = e.hits - pe.hits, euses - pe.hits - pe.misses
            parts.append(f"expert cache {_rate(ehits, euses)} hit")
    return "engine: " + " | ".join(parts)


def sample(state: ServerState) -> Sample:
    t = state.tracker
    return Sample(time.monotonic(), t.total_prompt_tokens, t.total_generation_tokens, state.client.stats)


async def log_engine_lines(state: ServerState, interval_s: float = INTERVAL_S) -> None:
    """Forever: a line each interval in which tokens flowed or requests were live."""
    prev = sample(state)
    while True:
        await asyncio.sleep(interval_s)
        now = sample(state)
        running, queued = state.tracker.live_counts()
        busy = now.prompt_tokens != prev.prompt_tokens or now.generation_tokens != prev.generation_tokens
        if busy or running or queued:
            log.info("%s", engine_line(prev, now, running, queued))
        prev = now
