"""Operations routes: `GET /metrics`, `GET /v1/stats`, `GET /v1/requests`, and `/health`'s body.

All but `/health` sit behind `--api-key` like every other route (the guard middleware).
`/v1/stats` asks the engine for a fresh snapshot first (waiting at most a moment, so a
busy engine cannot hold the answer up), so an idle server shows its idle KV pool.

Their query parameters are checked (`only_query`): one a route does not take (`/v1/stats?window=10`:
the window is fixed, `window_s`), or one given twice, is a 400 naming it, never silently ignored.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import Response

from edgemoe.messages import EngineStats
from edgemoe.server.errors import bad_request
from edgemoe.server.metrics import CONTENT_TYPE
from edgemoe.server.state import ServerState
from edgemoe.server.stats_models import (
    EngineView,
    ExpertCache,
    Health,
    KVPool,
    Latency,
    Memory,
    PrefixCache,
    RequestCounts,
    RequestEntry,
    RequestList,
    Stats,
    Summary,
    Throughput,
)
from edgemoe.server.windows import SampleWindow

# How long /v1/stats waits for the engine's fresh snapshot before using the last one.
FRESH_STATS_TIMEOUT_S = 0.25
MAX_REQUESTS_LIMIT = 1000


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.edgemoe
    return state


def health_body(state: ServerState) -> Health:
    name = state.model.name if state.model is not None else ""
    return Health(status="ok", model=name, uptime=round(state.uptime_s, 3))


def only_query(*names: str) -> Callable[[Request], None]:
    """A dependency: 400 for a query parameter outside `names`, or one given twice (FastAPI
    would read one of the values and drop the other)."""

    def check(request: Request) -> None:
        takes = f"takes {', '.join(names)}" if names else "takes no query parameters"
        seen: set[str] = set()
        for key, _ in request.query_params.multi_items():
            if key not in names:
                raise bad_request(f"{key}: unknown query parameter; {request.url.path} {takes}", param=key)
            if key in seen:
                raise bad_request(f"{key}: given more than once", param=key)
            seen.add(key)

    return check


def add_ops_routes(app: FastAPI) -> None:
    text = {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format"}

    @app.get("/metrics", response_class=Response, responses={200: text})
    async def metrics(request: Request) -> Response:
        return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/stats", dependencies=[Depends(only_query())])
    async def stats(request: Request) -> Stats:
        state = _state(request)
        snapshot = await state.client.fresh_stats(FRESH_STATS_TIMEOUT_S)
        return stats_body(state, snapshot)

    @app.get("/v1/requests", dependencies=[Depends(only_query("limit"))])
    async def requests(request: Request, limit: int = Query(50, ge=1, le=MAX_REQUESTS_LIMIT)) -> RequestList:
        tracker = _state(request).tracker
        live = tracker.in_flight()
        records = (live + tracker.log.recent(limit))[:limit]
        return RequestList(in_flight=len(live), data=[RequestEntry(**r.as_dict()) for r in records])


def _summary(window: SampleWindow, now: float) -> Summary:
    return Summary(**window.summary(now).as_dict())


def stats_body(state: ServerState, engine: EngineStats | None) -> Stats:
    tracker, now = state.tracker, time.monotonic()
    w = tracker.windows
    running, queued = tracker.live_counts()
    return Stats(
        model=state.model.name if state.model is not None else None,
        uptime_s=round(state.uptime_s, 3),
        window_s=w.requests.span_s,
        requests=RequestCounts(
            running=running, queued=queued, finished=sum(tracker.finish_counts.values()),
            by_finish_reason=dict(tracker.finish_counts), finished_per_s=w.requests.rate(now),
        ),
        throughput=Throughput(prompt_tokens_per_s=w.prompt_tokens.rate(now),
                              generation_tokens_per_s=w.generation_tokens.rate(now)),
        latency=Latency(ttft_s=_summary(w.ttft, now), inter_token_s=_summary(w.itl, now), e2e_s=_summary(w.e2e, now)),
        engine=engine_view(engine) if engine is not None else None,
    )


def engine_view(s: EngineStats) -> EngineView:
    in_use = s.kv_pages_total - s.kv_pages_free - s.kv_pages_evictable
    experts = None
    if s.expert_cache is not None:
        e = s.expert_cache
        uses = e.hits + e.misses
        experts = ExpertCache(
            hits=e.hits, misses=e.misses, hit_rate=e.hits / uses if uses else 0.0, experts_cpu=e.experts_cpu,
            bytes_copied=e.bytes_copied, tokens=e.tokens, misses_per_token=e.misses_per_token,
            hit_rate_by_layer=list(e.hit_rate_by_layer),
        )
    queried = s.prefix_cache_query_tokens
    return EngineView(
        age_s=max(0.0, time.time() - s.time),
        requests_running=s.requests_running,
        requests_waiting=s.requests_waiting,
        moe_backend=s.moe_backend,
        kv_pool=KVPool(
            pages_total=s.kv_pages_total, pages_free=s.kv_pages_free, pages_cached=s.kv_pages_cached,
            pages_evictable=s.kv_pages_evictable, pages_in_use=in_use,
            usage=in_use / s.kv_pages_total if s.kv_pages_total else 0.0,
        ),
        prefix_cache=PrefixCache(
            queries=s.prefix_cache_queries, query_tokens=queried, hit_tokens=s.prefix_cache_hit_tokens,
            hit_rate=s.prefix_cache_hit_tokens / queried if queried else 0.0,
        ),
        expert_cache=experts,
        memory=Memory(
            plan=dict(s.memory_plan), device_allocated_bytes=s.device_memory_allocated,
            device_reserved_bytes=s.device_memory_reserved, engine_host_rss_bytes=s.host_memory_rss,
        ),
    )
