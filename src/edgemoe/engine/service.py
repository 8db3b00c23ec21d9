"""The engine process: one loop that feeds ZMQ commands to an `Engine` and sends its outputs back.

    python -m edgemoe.engine.service --to-engine ADDR --from-engine ADDR --keys-fd FD [--settings JSON]

The server binds both sockets; this side connects (PULL for `EngineRequest` commands,
PUSH for `EngineEvent`s, msgpack-encoded) as a CURVE client with the keys read from
the inherited descriptor FD (`edgemoe.link_auth`). The loop blocks on the command socket only
while the engine is idle, so a busy engine steps back to back. A refused request gets
an `EngineError` for that request alone; an exception inside `step()` is fatal (the
engine's state can no longer be trusted): it is reported and the process exits 1.
`EngineStats` snapshots go out on request and every half second while busy
(`edgemoe.engine.stats_report`).

Torch is imported only by `build_engine`, so tests can run this loop in a thread with
a scripted stand-in engine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import zmq

from edgemoe.engine.stats_report import StatsReporter
from edgemoe.link_auth import (
    EngineKeys,
    LinkUnavailable,
    receive_keys,
    secure_engine_socket,
)
from edgemoe.messages import (
    AbortRequest,
    AddRequest,
    EngineError,
    EngineEvent,
    EngineOutputs,
    EngineReady,
    EngineRequest,
    RequestOutput,
    SamplingParams,
    ShutdownEngine,
    StatsRequest,
)

log = logging.getLogger(__name__)

# How long an idle loop waits for a command before checking that its parent still lives.
IDLE_POLL_MS = 250
# How long closing sockets may take to flush the last messages (the fatal error, say).
LINGER_MS = 2000
HANDSHAKE_MS = 10_000  # the most the engine waits for its command link before announcing itself


class EngineLike(Protocol):
    """What the loop needs from an engine (`edgemoe.engine.engine.Engine` or a test double)."""

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> str: ...

    def abort(self, request_id: str) -> RequestOutput | None: ...

    def has_work(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...


class EngineCrashed(RuntimeError):
    """`step()` raised: the loop reported it and stopped."""


class _Sockets:
    """The engine's two ends of the link, with their codecs."""

    def __init__(self, to_engine: str, from_engine: str, keys: EngineKeys) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.commands = self.ctx.socket(zmq.PULL)
        secure_engine_socket(self.commands, keys)
        handshake = self.commands.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)  # before connect: no event missed
        self.commands.connect(to_engine)
        _await_handshake(self.commands, handshake)
        self.events = self.ctx.socket(zmq.PUSH)
        self.events.setsockopt(zmq.SNDHWM, 0)  # never drop or block on outputs
        secure_engine_socket(self.events, keys)
        self.events.connect(from_engine)
        self._decode = msgspec.msgpack.Decoder(EngineRequest).decode
        self._encode = msgspec.msgpack.Encoder().encode

    def send(self, event: EngineEvent) -> None:
        self.events.send(self._encode(event))

    def poll(self, timeout_ms: int) -> list[EngineRequest]:
        """Every command waiting now; waits up to `timeout_ms` for the first one."""
        if not self.commands.poll(timeout_ms):
            return []
        out = []
        while True:
            try:
                out.append(self._decode(self.commands.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return out

    def close(self) -> None:
        self.commands.close(linger=0)
        self.events.close(linger=LINGER_MS)
        self.ctx.term()


def _await_handshake(sock: zmq.Socket[Any], monitor: zmq.Socket[Any], timeout_ms: int = HANDSHAKE_MS) -> None:
    """Wait until `sock`'s connection to the server has finished its (CURVE) handshake.
    Why: the server's command socket sends without blocking and fails while it has no
    peer, and it takes the ready event as "the engine can be sent to": announced before
    the command link was up, a request right after it got a 503 (a scripted engine, ready
    at once, did in CI). A server that never answers costs `timeout_ms`, then we go on."""
    try:
        if not monitor.poll(timeout_ms):
            log.warning("the command link's handshake did not finish in %d ms; going on", timeout_ms)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


def run_loop(
    engine: EngineLike,
    ready: EngineReady,
    to_engine: str,
    from_engine: str,
    *,
    keys: EngineKeys,
    parent_pid: int | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Announce `ready`, then serve commands until shutdown, `stop`, or the parent's death.

    `keys`: this launch's link keys (the server admits no other peer).
    Raises EngineCrashed (after reporting it) when `engine.step()` fails.
    """
    sockets = _Sockets(to_engine, from_engine, keys)
    try:
        sockets.send(ready)
        _serve(engine, sockets, parent_pid, stop)
    finally:
        sockets.close()


def _serve(
    engine: EngineLike, sockets: _Sockets, parent_pid: int | None, stop: threading.Event | None
) -> None:
    # Engines without `stats()` (test doubles) simply send no snapshots.
    experts = engine if hasattr(engine, "expert_map") and hasattr(engine, "watch_experts") else None
    reporter = StatsReporter(getattr(engine, "stats", None), experts)  # type: ignore[arg-type]
    while not (stop is not None and stop.is_set()):
        busy = engine.has_work()
        commands = sockets.poll(0 if busy else IDLE_POLL_MS)
        outputs: list[RequestOutput] = []
        for command in commands:
            if isinstance(command, ShutdownEngine):
                return
            if isinstance(command, StatsRequest):
                reporter.ask(command.experts)
                continue
            reporter.changed()
            outputs.extend(_apply(engine, command, sockets))
        if engine.has_work():
            reporter.changed()
            try:
                outputs.extend(engine.step())
            except Exception as exc:
                log.exception("engine step failed")
                sockets.send(EngineError(message=f"engine step failed: {exc!r}", fatal=True))
                raise EngineCrashed(str(exc)) from exc
        if outputs:
            sockets.send(EngineOutputs(outputs))
        if (snapshot := reporter.due()) is not None:
            sockets.send(snapshot)
        if parent_pid is not None and os.getppid() != parent_pid:
            log.warning("the server process is gone; the engine exits")
            return


def _apply(engine: EngineLike, command: AddRequest | AbortRequest, sockets: _Sockets) -> list[RequestOutput]:
    """Run one add/abort command; a refused add is answered with an error for that request."""
    if isinstance(command, AbortRequest):
        aborted = (engine.abort(rid) for rid in command.request_ids)
        return [out for out in aborted if out is not None]
    try:
        engine.add_request(command.prompt_ids, command.params, command.request_id)
    except ValueError as exc:
        sockets.send(EngineError(message=str(exc), request_id=command.request_id, invalid=True))
    except Exception as exc:  # a bug on one request must not take the others down
        log.exception("add_request failed")
        sockets.send(EngineError(message=f"internal error: {exc!r}", request_id=command.request_id))
    return []


# --------------------------------------------------------------------------- the process


# Test-only hook: "package.module:function", a function settings -> (engine, EngineReady)
# built instead of the real engine. Named by path, so production code imports no test code.
ENGINE_FACTORY_ENV = "EDGEMOE_ENGINE_FACTORY"


def _import_factory(path: str) -> Any:
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{ENGINE_FACTORY_ENV}={path!r}: cannot import it ({exc})") from exc


def build_engine(settings: dict[str, Any]) -> tuple[EngineLike, EngineReady]:
    """Load the real engine (imports torch) and describe it for the server."""
    factory = os.environ.get(ENGINE_FACTORY_ENV)
    if factory:  # test-only (make agents-smoke): a scripted engine, no model, no torch
        return _import_factory(factory)(settings)
    from edgemoe.config import EngineConfig
    from edgemoe.engine.engine import Engine

    engine = Engine(EngineConfig.from_kwargs(**settings), progress=True)
    source = engine.runtime.source
    ready = EngineReady(
        model_name=source.name,
        random_weights=source.random_weights,
        model_dir=str(engine.runtime.model_dir.resolve()),
        model_type=engine.runtime.model.arch.model_type,
        max_model_len=engine.max_model_len,
        vocab_size=engine.vocab_size,
        eos_token_ids=sorted(engine.eos_ids),
        pid=os.getpid(),
    )
    return engine, ready


def _report_fatal(to_engine: str, from_engine: str, keys: EngineKeys, message: str) -> None:
    """Tell the server why the engine could not start (it prints this and exits)."""
    sockets = _Sockets(to_engine, from_engine, keys)
    try:
        sockets.send(EngineError(message=message, fatal=True))
    finally:
        sockets.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m edgemoe.engine.service")
    parser.add_argument("--to-engine", required=True, help="ZMQ address of the command socket")
    parser.add_argument("--from-engine", required=True, help="ZMQ address of the event socket")
    parser.add_argument("--settings", default="{}", help="engine settings as a JSON object")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--keys-fd", type=int, required=True,
                        help="inherited descriptor to read the link keys from (edgemoe.link_auth.hand_over)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    # NOTE: Ctrl+C reaches the whole process group; the server owns shutdown and
    # stops this process with ShutdownEngine (or SIGTERM), so SIGINT is ignored here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="edgemoe engine: %(message)s")
    try:
        keys = receive_keys(args.keys_fd)  # first: the keys wait in a socket until read
    except (LinkUnavailable, OSError) as exc:
        print(f"edgemoe engine: {exc}", file=sys.stderr)  # no keys: the server cannot be told
        return 1
    try:
        engine, ready = build_engine(json.loads(args.settings))
    except Exception as exc:  # report every load failure (bad dir, bad flag, OOM) to the server
        if not isinstance(exc, ValueError | FileNotFoundError):  # those name the file or flag: no traceback
            traceback.print_exc(file=sys.stderr)
        _report_fatal(args.to_engine, args.from_engine, keys, f"{type(exc).__name__}: {exc}")
        return 1
    try:
        run_loop(engine, ready, args.to_engine, args.from_engine, keys=keys, parent_pid=args.parent_pid)
    except EngineCrashed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
