"""Every engine request's life, seen from the engine client: the single source for
metrics, the `/v1/stats` windows, the request log, the queue bound and the deadlines.

It is the client's `RequestObserver`, so every protocol's requests are counted the
same way without the routes doing anything. A request is "queued" from submission
until its first token, then "running" until it finishes, is aborted (client gone),
times out or fails. Times run from the HTTP request's arrival (`request_context`);
`clock` must be the clock arrivals are stamped with (`time.monotonic`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edgemoe.messages import AddRequest, RequestOutput
from edgemoe.server.admission import AdmissionGate
from edgemoe.server.metrics import ServerMetrics
from edgemoe.server.request_context import Arrival, Usage, current_arrival
from edgemoe.server.request_log import RequestLog, RequestRecord
from edgemoe.server.windows import RateWindow, SampleWindow


@dataclass
class _Live:
    request_id: str
    endpoint: str
    arrival_wall: float
    start: float  # monotonic arrival
    prompt_tokens: int
    deadline: float | None
    usage: Usage  # the HTTP request's, shared by its choices
    first: float | None = None
    last: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0

    def record(self, now: float, status: str, reason: str | None = None, error: str | None = None) -> RequestRecord:
        ttft = self.first - self.start if self.first is not None else None
        decode = None
        if self.first is not None and self.last is not None and self.output_tokens > 1 and self.last > self.first:
            decode = (self.output_tokens - 1) / (self.last - self.first)
        return RequestRecord(
            id=self.request_id, endpoint=self.endpoint, status=status, arrival=self.arrival_wall,
            prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
            completion_tokens=self.output_tokens, ttft_s=ttft,
            e2e_s=now - self.start if status == "finished" else None,
            decode_tokens_per_s=decode, finish_reason=reason, error=error,
        )


@dataclass
class Windows:
    """What `/v1/stats` reports as "now"."""

    prompt_tokens: RateWindow
    generation_tokens: RateWindow
    requests: RateWindow
    ttft: SampleWindow
    itl: SampleWindow
    e2e: SampleWindow

    @classmethod
    def create(cls, span_s: int = 60) -> Windows:
        return cls(RateWindow(span_s), RateWindow(span_s), RateWindow(span_s),
                   SampleWindow(span_s), SampleWindow(span_s, 8192), SampleWindow(span_s))


class RequestTracker:
    def __init__(
        self, metrics: ServerMetrics, gate: AdmissionGate, *, timeout_s: float | None = None,
        log: RequestLog | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.gate = gate
        self.timeout_s = timeout_s
        self.log = log or RequestLog()
        self.windows = Windows.create()
        self.finish_counts: dict[str, int] = {}
        self._clock = clock
        self._live: dict[str, _Live] = {}
        # Since the server started, for the periodic engine log line.
        self.total_prompt_tokens = 0
        self.total_generation_tokens = 0

    # -- counts ---------------------------------------------------------------------------

    @property
    def num_queued(self) -> int:
        return sum(1 for r in self._live.values() if r.first is None)

    @property
    def num_running(self) -> int:
        return len(self._live) - self.num_queued

    def live_counts(self) -> tuple[int, int]:
        """(running, queued), for the gauges."""
        queued = self.num_queued
        return len(self._live) - queued, queued

    def in_flight(self) -> list[RequestRecord]:
        """Records of the requests not finished yet, newest first."""
        now = self._clock()
        live = sorted(self._live.values(), key=lambda r: r.start, reverse=True)
        return [r.record(now, "queued" if r.first is None else "running") for r in live]

    def expired(self) -> list[str]:
        """Requests past their deadline."""
        now = self._clock()
        return [rid for rid, r in self._live.items() if r.deadline is not None and now >= r.deadline]

    # -- RequestObserver --------------------------------------------------------------------

    def on_submit(self, adds: list[AddRequest]) -> None:
        self.gate.check(self.num_queued, len(adds), self.windows.ttft.summary(self._clock()).p50)
        arrival = current_arrival()
        if arrival is None:  # not from an HTTP request (tests): it arrives now
            arrival = Arrival("internal", time.time(), self._clock())
        deadline = arrival.monotonic + self.timeout_s if self.timeout_s else None
        for add in adds:
            self._live[add.request_id] = _Live(
                add.request_id, arrival.endpoint, arrival.wall, arrival.monotonic, len(add.prompt_ids), deadline,
                arrival.usage)
            # Choices share their prompt: the HTTP request's prompt is counted once.
            arrival.usage.prompt_tokens = max(arrival.usage.prompt_tokens, len(add.prompt_ids))

    def on_output(self, out: RequestOutput) -> None:
        live = self._live.get(out.request_id)
        if live is None:
            return
        now = self._clock()
        live.cached_tokens = max(live.cached_tokens, out.num_cached_tokens)
        live.usage.cached_tokens = max(live.usage.cached_tokens, out.num_cached_tokens)
        if out.token_ids:
            self._on_tokens(live, len(out.token_ids), now)
        if out.finished:
            self._end(live, now, out.finish_reason or "stop", out.error)

    def on_end(self, request_ids: Iterable[str], reason: str, error: str | None = None) -> None:
        now = self._clock()
        for rid in request_ids:
            live = self._live.get(rid)
            if live is not None:
                self._end(live, now, reason, error)

    # -- internals ------------------------------------------------------------------------

    def _on_tokens(self, live: _Live, n: int, now: float) -> None:
        w = self.windows
        if live.first is None:
            live.first = now
            ttft = now - live.start
            self.metrics.first_token(ttft, live.prompt_tokens)
            w.ttft.add(ttft, now)
            w.prompt_tokens.add(live.prompt_tokens, now)
            self.total_prompt_tokens += live.prompt_tokens
            interval = None
        else:
            interval = now - (live.last or now)
            w.itl.add(interval / n, now)
        live.last = now
        live.output_tokens += n
        live.usage.completion_tokens += n
        self.total_generation_tokens += n
        self.metrics.tokens(n, interval)
        w.generation_tokens.add(n, now)

    def _end(self, live: _Live, now: float, reason: str, error: str | None) -> None:
        del self._live[live.request_id]
        e2e = now - live.start
        self.metrics.finished(reason, e2e)
        self.finish_counts[reason] = self.finish_counts.get(reason, 0) + 1
        self.windows.requests.add(1, now)
        self.windows.e2e.add(e2e, now)
        self.log.add(live.record(now, "finished", reason, error))
