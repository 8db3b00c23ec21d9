"""The server's end of the engine link: submit requests, route outputs, notice a dead engine.

One `EngineClient` per server, living on the server's event loop. It binds both ZMQ
sockets (the engine process connects), sends `EngineRequest` commands without
awaiting (so aborts can be sent from `finally` blocks of cancelled tasks), and routes
each `RequestOutput` to the `OutputStream` that owns its request id.

Engine death is noticed two ways: a fatal `EngineError`, or the watchdog seeing the
process (or test thread) gone. Either way every open stream fails at once with
`EngineUnavailable`, later submits fail the same way, and `on_dead` is called once.

A `RequestObserver` (metrics, admission, the request log) sees every request's
submit, outputs and end, whichever protocol sent it; `stats` holds the engine's
latest `EngineStats` snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
import zmq
import zmq.asyncio

from edgemoe.link_auth import LinkGuard, LinkKeys
from edgemoe.messages import (
    AbortRequest,
    AddRequest,
    EngineError,
    EngineEvent,
    EngineOutputs,
    EngineReady,
    EngineRequest,
    EngineStats,
    RequestOutput,
    ShutdownEngine,
    StatsRequest,
)

log = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 0.1


@dataclass(frozen=True)
class EngineLink:
    """The two ZMQ addresses shared by server and engine, and this launch's keys
    (`edgemoe.link_auth`: only the engine holding them can connect)."""

    to_engine: str
    from_engine: str
    keys: LinkKeys = field(default_factory=LinkKeys.generate, repr=False)

    @classmethod
    def in_dir(cls, directory: Path) -> EngineLink:
        """ipc:// sockets in `directory` (keep its path short: ipc paths max ~100 bytes)."""
        return cls(f"ipc://{directory}/to-engine.sock", f"ipc://{directory}/from-engine.sock")


class EngineHandle(Protocol):
    """Whatever runs the engine (a process, or a thread in tests)."""

    @property
    def pid(self) -> int | None: ...

    def alive(self) -> bool: ...

    def exit_description(self) -> str:
        """Why it is gone, for messages (e.g. "exit code -9")."""
        ...


class RequestObserver(Protocol):
    """Sees each engine request's life. Called on the event loop; must not block."""

    def on_submit(self, adds: list[AddRequest]) -> None:
        """A group is about to be sent; raising refuses it (nothing is sent)."""
        ...

    def on_output(self, out: RequestOutput) -> None:
        """An increment for a request still wanted (its last one has `finished`)."""
        ...

    def on_end(self, request_ids: Iterable[str], reason: str, error: str | None = None) -> None:
        """Requests that ended without a finished output: "abort", "timeout", "rejected" or "error"."""
        ...


class EngineUnavailable(Exception):
    """The engine is loading, gone, or the server is shutting down (HTTP 503)."""


class EngineRejected(Exception):
    """The engine refused this request's input (HTTP 400)."""


class EngineFailure(Exception):
    """The engine failed this request internally (HTTP 500)."""


class State(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DEAD = "dead"
    CLOSED = "closed"


class OutputStream:
    """Outputs of a group of engine requests (one per choice), in arrival order."""

    def __init__(self, client: EngineClient, request_ids: list[str]) -> None:
        self._client = client
        self.request_ids = list(request_ids)
        self.open_ids = set(request_ids)  # not finished yet
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    async def get(self) -> RequestOutput:
        """The next output of any request in the group; raises if the engine failed it."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def abort(self) -> None:
        """Stop every unfinished request of the group (idempotent; never raises)."""
        self._client.abort(self.open_ids)
        self.open_ids.clear()


class EngineClient:
    def __init__(self, link: EngineLink, handle: EngineHandle | None = None,
                 on_dead: Callable[[str], None] | None = None) -> None:
        self.link = link
        self.handle = handle
        self.on_dead = on_dead
        self.state = State.LOADING
        self.ready_info: EngineReady | None = None
        self.failure: str | None = None
        self._streams: dict[str, OutputStream] = {}
        self.observer: RequestObserver | None = None
        self.stats: EngineStats | None = None
        self._stats_waiters: list[asyncio.Future[EngineStats]] = []
        # Called with every snapshot (live views merge each one's expert map); must not block.
        self.stats_listeners: set[Callable[[EngineStats], None]] = set()
        self._settled = asyncio.Event()  # ready, dead or closed
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closing = False
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(EngineEvent).decode

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the sockets and start listening (idempotent)."""
        if self._started:
            return
        self._started = True
        self._sync_ctx: zmq.Context[Any] = zmq.Context()
        # NOTE: one underlying context for both socket kinds: the ZAP handler serves one context.
        self._async_ctx = zmq.asyncio.Context.shadow(self._sync_ctx.underlying)
        self._guard = LinkGuard(self._sync_ctx, self.link.keys)
        self._send_sock = self._sync_ctx.socket(zmq.PUSH)
        self._send_sock.setsockopt(zmq.SNDHWM, 0)
        self._guard.secure(self._send_sock)
        self._send_sock.bind(self.link.to_engine)
        self._recv_sock = self._async_ctx.socket(zmq.PULL)
        self._guard.secure(self._recv_sock)
        self._recv_sock.bind(self.link.from_engine)
        refusals = self._guard.report_refusals(self._async_ctx, [self._send_sock, self._recv_sock], self._engine_gone)
        self._tasks = [asyncio.create_task(c) for c in (self._receive(), self._watch(), refusals)]

    def _engine_gone(self) -> bool | None:  # failed, died or closed: a handshake it cut then is its own (link_auth)
        if self.state is State.READY:
            return None  # connected: a failing handshake is never the engine's
        return self.state in (State.DEAD, State.CLOSED) or self.failure is not None or (
            self.handle is not None and not self.handle.alive())

    def watch(self, handle: EngineHandle) -> None:
        """Start watching the engine's liveness (the process is spawned after `start`)."""
        self.handle = handle

    async def wait_ready(self) -> EngineReady:
        await self._settled.wait()
        if self.ready_info is None or self.state is not State.READY:
            raise EngineUnavailable(self.failure or "the engine is not available")
        return self.ready_info

    async def close(self, reason: str = "the server is shutting down", *, stop_engine: bool = False) -> None:
        """Fail every open request, stop the tasks, close the sockets (idempotent).

        With `stop_engine`, first ask the engine to exit (ShutdownEngine).
        """
        if self._closing:
            return
        self._closing = True
        if stop_engine and self._started and self.state is State.READY:
            with contextlib.suppress(EngineUnavailable):
                self._send(ShutdownEngine())
        if self.state in (State.LOADING, State.READY):
            self.state = State.CLOSED
            self.failure = reason
        self._fail_all(EngineUnavailable(reason))
        self._settled.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._started:
            self._send_sock.close(linger=500)  # lets a ShutdownEngine just sent go out
            self._recv_sock.close(linger=0)
            self._guard.stop()
            self._sync_ctx.term()

    # -- requests -----------------------------------------------------------------------

    def submit(self, adds: list[AddRequest]) -> OutputStream:
        """Send a group of requests; their outputs arrive on the returned stream.

        NOTE: all or nothing. Every request is encoded before anything is counted, and if
        any send fails (for whatever reason) the whole group is taken back out of the
        stream map and the observer's counts, and the ones already sent are aborted, so
        a failed submission never leaves a request queued for good.
        Raises EngineRejected (cannot be encoded), EngineUnavailable, or the observer's refusal.
        """
        self._check_usable()
        try:
            frames = [self._encode(add) for add in adds]
        except Exception as exc:  # e.g. an integer past 64 bits that validation missed
            raise EngineRejected(f"the request cannot be sent to the engine: {exc}") from exc
        if self.observer is not None:
            self.observer.on_submit(adds)
        stream = OutputStream(self, [a.request_id for a in adds])
        sent: list[str] = []
        try:
            for add, frame in zip(adds, frames, strict=True):
                self._streams[add.request_id] = stream
                self._send_frame(frame)
                sent.append(add.request_id)
        except BaseException as exc:
            self._take_back([a.request_id for a in adds], sent, exc)
            if isinstance(exc, Exception) and not isinstance(exc, EngineUnavailable):
                raise EngineUnavailable(f"cannot reach the engine: {exc!r}") from exc
            raise
        return stream

    def _take_back(self, request_ids: list[str], sent: list[str], exc: BaseException) -> None:
        """Undo a partly sent group: out of the map and the counts; abort what went out."""
        stream = None
        for rid in request_ids:
            stream = self._streams.pop(rid, None) or stream
        if stream is not None:
            stream.open_ids.clear()
        if self.observer is not None:
            self.observer.on_end(request_ids, "error", f"the request did not reach the engine: {exc!r}")
        if sent and self.state is State.READY:
            with contextlib.suppress(Exception):
                self._send(AbortRequest(sent))

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = [rid for rid in request_ids if self._streams.pop(rid, None) is not None]
        if ids and self.observer is not None:
            self.observer.on_end(ids, "abort")
        if ids and self.state is State.READY:
            self._send(AbortRequest(ids))

    def fail(self, request_ids: Iterable[str], exc: BaseException, reason: str) -> None:
        """End these requests with `exc` on their streams and abort them in the engine
        (a timeout: the consumer sees `exc`, the engine frees the pages)."""
        streams = {rid: self._streams.pop(rid) for rid in request_ids if rid in self._streams}
        for rid, stream in streams.items():
            stream.open_ids.discard(rid)
            stream.put(exc)
        if streams and self.observer is not None:
            self.observer.on_end(list(streams), reason, str(exc))
        if streams and self.state is State.READY:
            self._send(AbortRequest(list(streams)))

    async def fresh_stats(self, timeout: float, experts: bool = False) -> EngineStats | None:
        """Ask the engine for a snapshot; the latest one if none comes within `timeout`.
        `experts`: with the per-expert map (and keep the engine marking for a while)."""
        if self.state is not State.READY:
            return self.stats
        waiter: asyncio.Future[EngineStats] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(waiter)
        try:
            if experts or len(self._stats_waiters) == 1:  # callers already waiting share one request
                self._send(StatsRequest(experts))
            return await asyncio.wait_for(waiter, timeout)
        except (asyncio.TimeoutError, EngineUnavailable):
            return self.stats
        finally:
            if waiter in self._stats_waiters:
                self._stats_waiters.remove(waiter)

    def _check_usable(self) -> None:
        if self.state is not State.READY:
            raise EngineUnavailable(self.failure or "the model is still loading")

    def _send(self, command: EngineRequest) -> None:
        self._send_frame(self._encode(command))

    def _send_frame(self, frame: bytes) -> None:
        try:
            self._send_sock.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            raise EngineUnavailable(f"cannot reach the engine: {exc}") from exc

    # -- incoming -----------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            data = await self._recv_sock.recv()
            try:
                event = self._decode(data)
            except msgspec.DecodeError:
                log.exception("undecodable message from the engine (%d bytes)", len(data))
                continue
            if isinstance(event, EngineOutputs):
                self._route(event.outputs)
            elif isinstance(event, EngineStats):
                self._on_stats(event)
            elif isinstance(event, EngineError):
                self._on_error(event)
            elif isinstance(event, EngineReady) and self.state is State.LOADING:
                self.ready_info = event
                self.state = State.READY
                self._settled.set()

    def _route(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted by us: its final output is of no interest
            if out.finished:
                del self._streams[out.request_id]
                stream.open_ids.discard(out.request_id)
            if self.observer is not None:
                self.observer.on_output(out)
            stream.put(out)

    def _on_stats(self, stats: EngineStats) -> None:
        self.stats = stats
        for listener in list(self.stats_listeners):
            listener(stats)
        waiters, self._stats_waiters = self._stats_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(stats)

    def _on_error(self, error: EngineError) -> None:
        if error.fatal:
            self._die(f"the engine failed: {error.message}")
            return
        stream = self._streams.pop(error.request_id or "", None)
        if stream is not None:
            stream.open_ids.discard(error.request_id or "")
            if self.observer is not None:
                self.observer.on_end([error.request_id or ""], "rejected" if error.invalid else "error", error.message)
            stream.put(EngineRejected(error.message) if error.invalid else EngineFailure(error.message))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            if self.handle is not None and not self.handle.alive():
                self._die(f"the engine process exited ({self.handle.exit_description()})")
                return

    def _die(self, reason: str) -> None:
        if self.state in (State.DEAD, State.CLOSED):
            return
        log.error("%s", reason)
        self.state = State.DEAD
        self.failure = reason
        self._fail_all(EngineUnavailable(reason))
        self._settled.set()
        if self.on_dead is not None:
            self.on_dead(reason)

    def _fail_all(self, exc: BaseException) -> None:
        streams = {id(s): s for s in self._streams.values()}
        if self._streams and self.observer is not None:
            self.observer.on_end(list(self._streams), "error", str(exc))
        self._streams.clear()
        for stream in streams.values():
            stream.open_ids.clear()
            stream.put(exc)
