"""Connection limits: no client can hold the server's connections, or its memory, for long.

uvicorn bounds keep-alive and request sizes but has no read deadlines: a client that
trickles its headers, trickles its body or never reads its response keeps its
connection (and whatever is buffered for it) forever. `LimitedH11Protocol` is
uvicorn's h11 protocol with our own watchdog:

- at most `--max-connections` open; a connection beyond answers 503 (in its route's
  error shape, `Retry-After: 1`, `Connection: close`) once its request arrives;
- a connection idle before its first byte, or between requests, closes after
  `--keep-alive-timeout`;
- a request's headers must be complete within `--header-timeout` of the wait for them
  starting, and its body must keep arriving at `--body-min-rate` bytes/s on average
  after a first `--header-timeout` seconds; otherwise 408 and the connection closes;
- a response is never timed out, but it never waits for a client that stopped reading
  either: writes go to the transport's buffer, and a write while the client leaves
  more than `--max-send-buffer` bytes unread disconnects it. The route then sees the
  disconnect and its engine requests are aborted. A finished response the client
  stops taking is dropped once it made no progress for a keep-alive period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from edgemoe.log_limit import LogLimiter
from edgemoe.server.anthropic_errors import anthropic_error_body, is_anthropic_path
from edgemoe.server.errors import APIError, error_response

if TYPE_CHECKING:
    from edgemoe.server.config import ServerConfig

log = logging.getLogger(__name__)
_slow_senders = LogLimiter(log)  # clients too slow to send their request
_non_readers = LogLimiter(log)  # clients that stopped reading their response
# While we ourselves stop reading (the app has not taken the body yet), the body clock
# is checked this often and credited the time.
_PAUSED_RECHECK_S = 1.0
# What a connection over the limit reads of its request body before answering (so the
# client sees the 503 rather than a reset from unread data).
_OVER_LIMIT_DRAIN = 1 << 20


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout: float
    body_min_rate: float
    keep_alive_timeout: float
    max_send_buffer: int

    @classmethod
    def of(cls, config: ServerConfig) -> ConnectionLimits:
        return cls(config.max_connections, config.header_timeout, config.body_min_rate,
                   config.keep_alive_timeout, config.max_send_buffer)


def uvicorn_options(config: ServerConfig) -> dict[str, Any]:
    """The `uvicorn.Config` keywords that put these limits in force."""
    limits = ConnectionLimits.of(config)
    protocol = type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": limits})
    return {"http": protocol, "ws": "none", "timeout_keep_alive": limits.keep_alive_timeout}


class _BoundedFlow(FlowControl):
    """uvicorn's flow control, except that a write never waits for the client: the
    transport pauses us past its high-water mark (--max-send-buffer), and a write while
    paused disconnects the client instead of waiting (`drain` is where uvicorn waits)."""

    def __init__(self, transport: asyncio.Transport, on_overflow: Callable[[], None]) -> None:
        super().__init__(transport)
        self._on_overflow = on_overflow

    async def drain(self) -> None:
        self._on_overflow()


class LimitedH11Protocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]

    # -- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _BoundedFlow(transport, self._overflowed)
        transport.set_write_buffer_limits(high=self.limits.max_send_buffer)
        # The kernel's send buffer too: left to autotune it grows to megabytes for a
        # client that reads nothing, all of it held before our own bound even starts.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.max_send_buffer)
        self._timer: asyncio.TimerHandle | None = None
        self._watched: object = None  # the cycle whose request is being read
        self._in_body = False
        self._body_since = 0.0
        self._body_bytes = 0
        self._unsent = float("inf")  # write-buffer size at the last keep-alive check
        if len(self.connections) > self.limits.max_connections:
            self.app = _over_limit(self.limits.max_connections)
        self._await_request()
        # NOTE: uvicorn arms its keep-alive timer only after a response; a connection
        # that never sends a byte is idle from the start.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        in_body = self._in_body  # bytes that arrive with the headers earn no credit
        super().data_received(data)
        if in_body:
            self._body_bytes += len(data)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not self._watched:  # a new request's headers are in
            self._watched = cycle
            self._disarm()
            self._in_body = cycle.more_body
            if self._in_body:
                self._body_since, self._body_bytes = self.loop.time(), 0
                self._arm(self.limits.header_timeout, self._check_body)
        elif self._in_body and cycle is not None and not cycle.more_body:
            self._in_body = False
            self._disarm()

    def on_response_complete(self) -> None:
        self._unsent = float("inf")
        if not self.transport.is_closing():
            self._await_request()
        super().on_response_complete()  # may parse a pipelined request at once

    # -- reading deadlines --------------------------------------------------------------

    def _await_request(self) -> None:
        self._in_body = False
        self._arm(self.limits.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        if self.transport.is_closing():
            return
        self._refuse(f"its request headers took longer than {self.limits.header_timeout:g} s (--header-timeout)")

    def _check_body(self) -> None:
        cycle = self.cycle
        if cycle is not self._watched or not self._in_body or self.transport.is_closing():
            return
        if self.flow.read_paused:  # our pause, not the client's: credit the time
            self._body_since += _PAUSED_RECHECK_S
            self._arm(_PAUSED_RECHECK_S, self._check_body)
            return
        due = self._body_since + self.limits.header_timeout + self._body_bytes / self.limits.body_min_rate
        if self.loop.time() < due:
            self._arm(due - self.loop.time(), self._check_body)
            return
        self._refuse(f"its request body arrived slower than {self.limits.body_min_rate:g} bytes/s (--body-min-rate)")

    def _refuse(self, why: str) -> None:
        """408 (unless a response started) and close: the client was too slow to send."""
        _slow_senders.warning("closed a connection from %s: %s", _peer(self.client), why)
        cycle = self.cycle if self._in_body else None
        if cycle is None or not cycle.response_started:
            path = str(cycle.scope.get("path", "")) if cycle is not None else ""
            self.transport.write(_raw_error(APIError(408, f"request timeout: {why}", code="request_timeout"), path))
        if cycle is not None:  # the app waiting for the body sees a disconnect; its sends are dropped
            cycle.disconnected = True
            cycle.message_event.set()
        self._in_body = False
        self.transport.close()

    # -- writing ------------------------------------------------------------------------

    def _overflowed(self) -> None:
        _non_readers.warning("disconnected %s: it left %d bytes of its response unread (--max-send-buffer %d)",
                            _peer(self.client), self.transport.get_write_buffer_size(), self.limits.max_send_buffer)
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()  # the route's disconnect watch ends its generation
        self.transport.abort()

    def timeout_keep_alive_handler(self) -> None:
        unsent = self.transport.get_write_buffer_size()
        if unsent and unsent < self._unsent:  # still taking its last response: wait on
            self._unsent = unsent
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)
            return
        if unsent:  # close() would wait for the flush forever
            _non_readers.warning("disconnected %s: it stopped taking its response (%d bytes unsent)",
                                _peer(self.client), unsent)
            self.transport.abort()
            return
        super().timeout_keep_alive_handler()

    # -- timers -------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(max(delay, 0.0), callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


def _raw_error(err: APIError, path: str) -> bytes:
    """A complete `Connection: close` response, written below h11 (no request may have been parsed)."""
    body = json.dumps(anthropic_error_body(err) if is_anthropic_path(path) else err.body()).encode()
    head = (f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def _over_limit(limit: int) -> Callable[[Scope, Receive, Send], Any]:
    """The app a connection over --max-connections gets: 503, retry in a second, close."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        taken = 0
        while taken <= _OVER_LIMIT_DRAIN:
            message = await receive()
            taken += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        err = APIError(503, f"the server has its limit of {limit} connections open (--max-connections); "
                       "retry shortly", code="too_many_connections")
        response = error_response(err, str(scope.get("path", "")))
        response.headers["Retry-After"] = "1"
        response.headers["Connection"] = "close"
        await response(scope, receive, send)

    return app
