"""Where and when the current HTTP request arrived, for code far from the route.

The request tracker sees engine requests at the engine client, deep below the routes;
it reads this context to tag each one with its endpoint and to measure TTFT and
latency from the HTTP request's arrival (template rendering and queueing included),
as a client sees them. A pure ASGI middleware sets it: the route runs in the same
task, so the context variable is visible there.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send


@dataclass
class Usage:
    """Tokens of every engine request an HTTP request made (for its access-log line)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Arrival:
    endpoint: str  # "POST /v1/chat/completions"
    wall: float  # time.time()
    monotonic: float  # time.monotonic(), for durations
    usage: Usage = field(default_factory=Usage)  # filled in by the request tracker


_current: contextvars.ContextVar[Arrival | None] = contextvars.ContextVar("edgemoe_arrival", default=None)


def current_arrival() -> Arrival | None:
    """The current HTTP request's arrival (None outside one)."""
    return _current.get()


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = Arrival(f"{scope.get('method', '')} {scope.get('path', '')}", time.time(), time.monotonic())
        token = _current.set(arrival)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
