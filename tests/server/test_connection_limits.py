"""Issue 11, item 6 (and 9's unread stream): slow, idle and non-reading clients cannot hold
the server. Raw sockets on loopback against a server with short limits:

- 200 connections trickling header bytes, one trickling a body, one idle: all closed
  by the watchdog (408 or plain close) while other clients are served in time;
- a body sent slowly but above --body-min-rate is accepted;
- idle keep-alive connections close after --keep-alive-timeout;
- past --max-connections, a request is answered 503 (error shape, Retry-After) and
  closed, and the server serves again once connections free up;
- a client that never reads its stream is disconnected once it leaves
  --max-send-buffer bytes unread, and its generation is aborted in the engine.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from attack_support import assert_idle, assert_serving, baseline
from server_harness import MakeServer, ServerHarness
from uvicorn.server import ServerState

HEADER_S = 0.6
KEEP_ALIVE_S = 0.5
MIN_RATE = 1024
LIMITS = {"header_timeout": HEADER_S, "keep_alive_timeout": KEEP_ALIVE_S, "body_min_rate": MIN_RATE}


@pytest.fixture(scope="module")
def server(make_scripted: MakeServer) -> ServerHarness:
    return make_scripted(**LIMITS)


def connect(h: ServerHarness, rcvbuf: int | None = None) -> socket.socket:
    host, port = h.base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect: the window is negotiated then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5)
    sock.connect((host, int(port)))
    return sock


def read_to_close(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and when it closed (asserts it does)."""
    t0, data = time.monotonic(), b""
    sock.settimeout(timeout)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {timeout} s; got {data[:200]!r}") from None
    return data, time.monotonic() - t0


def request_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


class Trickler:
    """Sends one byte per `period` on every socket until stopped (a slow-loris)."""

    def __init__(self, socks: list[socket.socket], data: bytes, period: float) -> None:
        self.socks, self.data, self.period = socks, data, period
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.wait(self.period) and i < len(self.data):
            for sock in self.socks:
                try:
                    sock.send(self.data[i:i + 1])
                except OSError:
                    pass  # closed by the server: what we want
            i += 1


def test_slow_and_idle_connections_are_closed(server: ServerHarness) -> None:
    alone = baseline(server.base_url)
    loris = [connect(server) for _ in range(200)]
    headers = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    trickle = Trickler(loris, headers, period=0.05)  # ~20 B/s: headers never complete in time
    body_sock = connect(server)
    body_sock.sendall(request_head("/v1/chat/completions", 100_000) + b'{"model": "m", ')
    body_trickle = Trickler([body_sock], b" " * 1000, period=0.02)  # 50 B/s, far below MIN_RATE
    idle = connect(server)
    try:
        assert_serving(server.base_url, alone)  # during the attack
        t0 = time.monotonic()
        _, idle_after = read_to_close(idle, 5)
        body_reply, _ = read_to_close(body_sock, 5)
        for sock in loris:
            reply, _ = read_to_close(sock, 5)
            assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
        closed_all = time.monotonic() - t0
        assert_serving(server.base_url, alone)  # and after
    finally:
        trickle.stop.set()
        body_trickle.stop.set()
        for sock in [*loris, body_sock, idle]:
            sock.close()
    assert idle_after < KEEP_ALIVE_S + 1.0
    assert closed_all < HEADER_S + 2.0  # every header trickler, within the header deadline (+ slack)
    status, _, rest = body_reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408")
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert "body-min-rate" in error["message"] and error["code"] == "request_timeout"
    assert_idle(server.base_url)


def test_a_slow_body_above_the_minimum_rate_is_accepted(server: ServerHarness) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2400}], "max_tokens": 2}).encode()
    sock = connect(server)
    try:
        sock.sendall(request_head("/v1/chat/completions", len(body)))
        for i in range(0, len(body), 256):  # ~2.5 KiB/s for ~1 s: slower than the grace, above the rate
            sock.sendall(body[i:i + 256])
            time.sleep(0.1)
        reply = sock.recv(65536)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_idle_keep_alive_is_closed(server: ServerHarness) -> None:
    sock = connect(server)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply, closed_after = read_to_close(sock, 5)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 200")
    assert closed_after < KEEP_ALIVE_S + 1.0


@pytest.fixture
def capped(make_scripted: MakeServer) -> Iterator[ServerHarness]:
    yield make_scripted(max_connections=4, header_timeout=30, keep_alive_timeout=30)


def test_connections_past_the_limit_get_503_until_some_close(capped: ServerHarness) -> None:
    holders = [connect(capped) for _ in range(4)]
    time.sleep(0.1)
    try:
        for path, shape in [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")]:
            extra = connect(capped)
            extra.sendall(request_head(path, 2) + b"{}")
            reply, _ = read_to_close(extra, 5)
            extra.close()
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower(), head
            assert b"connection: close" in head.lower()
            err = json.loads(body)
            message = err["error"]["message"] if shape == "openai" else err["error"]["message"]
            assert "--max-connections" in message and (shape == "openai") == ("type" not in err)
    finally:
        for sock in holders:
            sock.close()
    time.sleep(0.1)
    assert httpx.get(f"{capped.base_url}/health").status_code == 200


def _hang_stream_request(n: int) -> bytes:
    body = json.dumps({"model": "m", "stream": True, "n": n, "max_tokens": 100_000, "logprobs": True,
                       "top_logprobs": 5, "messages": [{"role": "user", "content": "[[hang]]"}]}).encode()
    return request_head("/v1/chat/completions", len(body)) + body


def test_a_client_that_never_reads_is_cut_off_and_aborted(
    make_scripted: MakeServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgemoe.log_limit import LogLimiter
    from edgemoe.server import connections

    monkeypatch.setattr(connections, "_non_readers", LogLimiter(connections.log))  # nothing logged yet
    h = make_scripted(max_send_buffer=16 * 1024)
    alone = baseline(h.base_url)
    sock = connect(h, rcvbuf=4096)
    try:
        sock.sendall(_hang_stream_request(n=4))
        deadline = time.monotonic() + 20
        while not h.engine.requests:  # generating for nobody...
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert_serving(h.base_url, alone)
        while h.engine.requests:  # ...until the server gives up on the reader
            assert time.monotonic() < deadline, "the generation runs on for a client that reads nothing"
            time.sleep(0.05)
        assert_serving(h.base_url, alone)
        assert_idle(h.base_url)
        # The connection is gone: reading drains what the kernel held, then EOF or reset.
        data, _ = read_to_close(sock, 5)
        assert data.startswith(b"HTTP/1.1 200")
        print(f"the non-reader was sent {len(data)} bytes before the cut")
        # What it got is bounded by the buffers: its receive window, the server's kernel
        # send buffer and --max-send-buffer (each small here); unbounded, it would be MBs.
        assert len(data) < 256 * 1024
    finally:
        sock.close()
    assert any("unread" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_limits_are_validated() -> None:
    from edgemoe.server.config import ServerConfig

    for name in ("max_connections", "header_timeout", "body_min_rate", "keep_alive_timeout",
                 "max_send_buffer", "stream_heartbeat"):
        with pytest.raises(ValueError, match=f"--{name.replace('_', '-')}"):
            ServerConfig(**{name: 0})


class _Transport(asyncio.Transport):
    """A transport whose unsent-byte count the test sets (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.unsent = 0
        self.aborted = self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 1919)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.aborted or self.closed

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True

    def write(self, data: Any) -> None:
        pass


def test_a_finished_response_nobody_takes_is_dropped_without_progress() -> None:
    """After its response, a connection whose client stops taking the rest is aborted at the
    first keep-alive check without progress (close() would wait for the flush forever);
    one still draining is left alone, and an emptied one closes normally."""
    import uvicorn

    from edgemoe.server.config import ServerConfig
    from edgemoe.server.connections import uvicorn_options

    config = uvicorn.Config(app=lambda *a: None, **uvicorn_options(ServerConfig(keep_alive_timeout=60)))
    config.load()
    loop = asyncio.new_event_loop()
    try:
        for sizes, ends in [([5000, 5000], "aborted"), ([5000, 4000, 3000], "open"), ([0], "closed")]:
            proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
            transport = _Transport()
            proto.connection_made(transport)
            for unsent in sizes:
                transport.unsent = unsent
                proto.timeout_keep_alive_handler()
            state = "aborted" if transport.aborted else "closed" if transport.closed else "open"
            assert state == ends, (sizes, state)
            proto.connection_lost(None)
    finally:
        loop.close()
