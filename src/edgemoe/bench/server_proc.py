"""Start `edgemoe serve` as a subprocess on a free loopback port for a benchmark."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(settings: dict[str, Any], port: int) -> list[str]:
    from edgemoe.config import setting_argv

    return [sys.executable, "-m", "edgemoe.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            *setting_argv(settings)]


@contextlib.contextmanager
def running_server(settings: dict[str, Any], timeout_s: float = 600) -> Iterator[str]:
    """Yield the base URL once the server printed its ready line; stop it on exit."""
    port = free_port()
    proc = subprocess.Popen(serve_command(settings, port), stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + timeout_s
        assert proc.stdout is not None
        for line in proc.stdout:
            if "edgemoe ready on" in line:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("edgemoe serve did not become ready")
        else:
            raise RuntimeError(f"edgemoe serve exited with {proc.wait()} before it was ready")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
