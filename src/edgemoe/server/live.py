"""`GET /v1/stats/stream`: the engine's state as a stream of frames, for the web page's live view.

Server-sent events, one `data: {frame}` every `interval` seconds: the `/v1/stats` body,
throughput over the last interval, the requests in flight and, with `experts=true`, the
expert map (what each expert of each MoE layer did since the previous frame: resident,
hit, miss, computed on the CPU). The page reads it with `fetch()`, so the API key
travels in a header as on every other route (an EventSource cannot send one).

Asking for the map turns on the engine's per-expert marking for a few seconds
(`engine/stats_report.py`); when the last stream closes it stops by itself. Every
snapshot's map is merged into each open stream's next frame, so two pages watching at
once each see every event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import StreamingResponse

from edgemoe.messages import EngineStats, ExpertMap
from edgemoe.server.state import ServerState
from edgemoe.server.stats_api import FRESH_STATS_TIMEOUT_S, only_query, stats_body
from edgemoe.server.stats_models import (
    ExpertMapView,
    LiveFrame,
    LiveRates,
    RequestEntry,
)

MIN_INTERVAL_S, MAX_INTERVAL_S, DEFAULT_INTERVAL_S = 0.1, 10.0, 0.5
_EVENT = ord("2")  # codes "2".."4" are events; "0"/"1" only say where the expert lives


def merge_cells(old: str, new: str) -> str:
    """One layer's codes: the strongest event of either map, else the newer residency."""
    a = np.frombuffer(old.encode("ascii"), dtype=np.uint8)
    b = np.frombuffer(new.encode("ascii"), dtype=np.uint8)
    if a.shape != b.shape:
        return new
    return bytes(np.maximum(np.where(a >= _EVENT, a, 0), b).astype(np.uint8)).decode("ascii")


class ExpertMapMerger:
    """The maps of every snapshot since this stream's last frame, merged."""

    def __init__(self) -> None:
        self._pending: ExpertMap | None = None

    def add(self, stats: EngineStats) -> None:
        new = stats.experts
        if new is None:
            return
        old = self._pending
        if old is None or old.layers != new.layers or old.num_experts != new.num_experts:
            self._pending = new
            return
        cells = [merge_cells(a, b) for a, b in zip(old.cells, new.cells, strict=True)]
        self._pending = ExpertMap(layers=new.layers, num_experts=new.num_experts, cells=cells)

    def take(self) -> ExpertMap | None:
        pending, self._pending = self._pending, None
        return pending


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.edgemoe
    return state


class _Totals:
    """Token totals at one moment, for the rates over a frame's interval."""

    def __init__(self, state: ServerState) -> None:
        self.time = time.monotonic()
        self.prompt = state.tracker.total_prompt_tokens
        self.generation = state.tracker.total_generation_tokens

    def rates(self, before: _Totals) -> LiveRates:
        seconds = max(self.time - before.time, 1e-6)
        return LiveRates(prompt_tokens_per_s=(self.prompt - before.prompt) / seconds,
                         generation_tokens_per_s=(self.generation - before.generation) / seconds,
                         seconds=seconds)


async def live_frames(state: ServerState, interval: float, experts: bool) -> AsyncIterator[str]:
    """Frames until the client goes away (the response is cancelled then)."""
    merger = ExpertMapMerger()
    if experts:
        state.client.stats_listeners.add(merger.add)
    try:
        before = _Totals(state)
        while True:
            started = time.monotonic()
            snapshot = await state.client.fresh_stats(FRESH_STATS_TIMEOUT_S, experts=experts)
            now = _Totals(state)
            yield "data: " + frame(state, snapshot, merger.take(), now.rates(before), interval) + "\n\n"
            before = now
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    finally:
        state.client.stats_listeners.discard(merger.add)


def frame(state: ServerState, snapshot: EngineStats | None, experts: ExpertMap | None,
          rates: LiveRates, interval: float) -> str:
    in_flight = [RequestEntry(**r.as_dict()) for r in state.tracker.in_flight()[:50]]
    view = None
    if experts is not None:
        view = ExpertMapView(layers=experts.layers, num_experts=experts.num_experts, cells=experts.cells)
    body = LiveFrame(time=time.time(), interval_s=interval, stats=stats_body(state, snapshot), rates=rates,
                     in_flight=in_flight, experts=view)
    return json.dumps(body.model_dump(), separators=(",", ":"))


def add_live_routes(app: FastAPI) -> None:
    # NOTE: not in /openapi.json: an endless stream cannot be checked by request/response
    # fuzzing (schemathesis would wait forever); docs/api.md describes it.
    async def stats_stream(
        request: Request,
        interval: float = Query(DEFAULT_INTERVAL_S, ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S),
        experts: bool = Query(True),
    ) -> StreamingResponse:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(live_frames(_state(request), interval, experts),
                                 media_type="text/event-stream", headers=headers)

    for path in ("/v1/stats/stream", "/v1/stats/stream/"):
        app.add_api_route(path, stats_stream, methods=["GET"], include_in_schema=False,
                          dependencies=[Depends(only_query("interval", "experts"))])
