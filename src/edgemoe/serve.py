"""`edgemoe serve`: this process becomes the HTTP server and spawns the engine process.

    server (this process, no torch)  ── ipc:// ZMQ, msgspec ──  engine (python -m edgemoe.engine.service)

Lifecycle: bind the link, spawn the engine, start uvicorn; once the engine is ready
and uvicorn listens, print the one ready line. SIGINT/SIGTERM: end open requests
(503), stop uvicorn, ask the engine to exit (then SIGTERM/SIGKILL it), exit 0. If the
engine dies: the client fails every open request with 503 at once, and the server
exits 1 a moment later (so those answers get out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from edgemoe.link_auth import hand_over
from edgemoe.server.app import create_app
from edgemoe.server.config import ServerConfig
from edgemoe.server.connections import uvicorn_options
from edgemoe.server.engine_client import EngineClient, EngineLink, State

# How long open responses get to flush after the engine died, before the server exits.
DEATH_GRACE_S = 0.5
# How long the engine gets to exit after ShutdownEngine, then after SIGTERM.
ENGINE_STOP_S = 2.0


class EngineProcess:
    """The engine as a child process (an `EngineHandle`)."""

    def __init__(self, link: EngineLink, settings: dict[str, Any]) -> None:
        # The link keys travel through an inherited socket, never argv or the environment.
        keys = hand_over(link.keys.engine_keys())
        command = [
            sys.executable, "-m", "edgemoe.engine.service",
            "--to-engine", link.to_engine, "--from-engine", link.from_engine,
            "--settings", json.dumps(settings), "--parent-pid", str(os.getpid()),
            "--keys-fd", str(keys.fileno()),
        ]
        # NOTE: the engine writes to our stderr, so stdout carries only the ready line;
        # loading progress and tracebacks stay visible.
        with keys:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sys.stderr,
                                         pass_fds=(keys.fileno(),))

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    async def stop(self, graceful: bool) -> None:
        """Wait for a clean exit (after ShutdownEngine) if `graceful`, then escalate."""
        steps = (None, self.proc.terminate, self.proc.kill) if graceful else (self.proc.terminate, self.proc.kill)
        for escalate in steps:
            if escalate is not None and self.alive():
                escalate()
            for _ in range(int(ENGINE_STOP_S / 0.05)):
                if not self.alive():
                    return
                await asyncio.sleep(0.05)


class _Server(uvicorn.Server):
    """uvicorn without its signal handling: `serve` installs its own (and never re-raises)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Serve:
    """One `edgemoe serve` run: owns the engine process, the client and uvicorn."""

    def __init__(self, config: ServerConfig, settings: dict[str, Any], link: EngineLink) -> None:
        self.config = config
        self.settings = settings
        self.exit_code = 0
        self.stopping = False  # a signal or an error ends the run: nothing more to announce
        self.client = EngineClient(link, on_dead=self._on_engine_dead)
        self.app = create_app(config, self.client)
        self.server = _Server(uvicorn.Config(
            self.app, host=config.host, port=config.port, log_level="warning",
            access_log=False, lifespan="on", timeout_graceful_shutdown=2, **uvicorn_options(config),
        ))

    def _on_engine_dead(self, reason: str) -> None:
        if self.stopping:
            return  # we are stopping it
        print(f"edgemoe serve: {reason}; shutting down", file=sys.stderr, flush=True)
        self.exit_code = 1
        asyncio.get_running_loop().call_later(DEATH_GRACE_S, self._exit)

    def _exit(self) -> None:
        self.server.should_exit = True

    def _on_signal(self) -> None:
        if self.server.should_exit:
            self.server.force_exit = True  # a second Ctrl+C: stop waiting
            return
        self.stopping = True
        # Open requests end now (503) rather than holding the shutdown up.
        asyncio.get_running_loop().create_task(self.client.close(stop_engine=True))
        self._exit()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        await self.client.start()  # bind before the engine connects
        engine = EngineProcess(self.client.link, self.settings)
        self.client.watch(engine)
        announcer = asyncio.create_task(self._announce())
        try:
            await self.server.serve()
        except SystemExit as exc:  # uvicorn exits on bind errors (port in use, a host it can't resolve)
            self.exit_code = exc.code if isinstance(exc.code, int) and exc.code else 1
            # uvicorn's own line says why (e.g. "[Errno 98] address already in use"); this one says which flags
            print(f"edgemoe serve: error: cannot listen on --host {self.config.host} --port {self.config.port} "
                  "(the line above says why)", file=sys.stderr, flush=True)
        finally:
            self.stopping = True
            announcer.cancel()
            # An engine that never became ready cannot read ShutdownEngine: terminate it.
            graceful = self.client.ready_info is not None
            await self.client.close(stop_engine=True)
            await engine.stop(graceful)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        return self.exit_code

    async def _announce(self) -> None:
        state = self.app.state.edgemoe
        await state.settled.wait()
        if self.stopping or self.client.state is State.CLOSED:
            return  # stopped on purpose (signal, or uvicorn failed to start and said why)
        if state.model is None:
            if self.exit_code == 0:  # else the engine's death was reported already
                print(f"edgemoe serve: error: {state.unavailable_reason()}", file=sys.stderr, flush=True)
            self.exit_code = 1
            self._exit()
            return
        while not self.server.started:
            await asyncio.sleep(0.02)
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        port = self._bound_port()
        weights = "; random weights" if state.model.info.random_weights else ""
        print(f"edgemoe ready on http://{host}:{port} (model {state.model.name}{weights})", flush=True)

    def _bound_port(self) -> int:
        for server in self.server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.config.port


def run_serve(config: ServerConfig, settings: dict[str, Any]) -> int:
    """Serve until a signal (exit 0) or the engine's death (exit 1)."""
    from edgemoe.config import EngineConfig
    from edgemoe.moe.routing_spec import ROUTER

    EngineConfig.from_kwargs(**settings)  # torch-free: a bad flag is one message before the engine starts
    if settings.get("routing", ROUTER) != ROUTER:
        raise ValueError(
            f"routing (--routing) {settings['routing']!r} replaces the model's expert choices with a synthetic "
            "process for cache studies: its answers are meaningless, so serve refuses it "
            "(use edgemoe bench decode or generate)"
        )
    # NOTE: a short directory: ipc socket paths are limited to ~100 bytes.
    with tempfile.TemporaryDirectory(prefix="edgemoe-") as tmp:
        serve = _Serve(config, settings, EngineLink.in_dir(Path(tmp)))
        return asyncio.run(serve.run())
