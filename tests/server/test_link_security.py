"""Issue 11, item 8: the engine link admits only this launch's engine.

Foreign ZMQ sockets of the same user connect to both of the server's endpoints, with
no security at all and with CURVE using the server's own public key (an attacker
who somehow learned it) but their own key pair. They must read no prompt, inject no
text, and kill nothing, while live requests keep working; each refusal is logged,
rate-limited.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from attack_support import assert_idle, assert_serving, baseline
from server_harness import MakeServer, ServerHarness

from edgemoe.link_auth import EngineKeys, hand_over, receive_keys
from edgemoe.messages import EngineError, EngineOutputs, RequestOutput

SECRET = "zebra-secret-prompt"


@pytest.fixture(scope="module")
def server(make_scripted: MakeServer) -> ServerHarness:
    return make_scripted()


@pytest.fixture
def foreign(server: ServerHarness) -> Iterator[Any]:
    """foreign(kind, address) -> a connected socket: plain, or CURVE with the server's key."""
    ctx: zmq.Context[Any] = zmq.Context()
    socks: list[zmq.Socket[Any]] = []

    def make(kind: int, address: str, curve: bool) -> zmq.Socket[Any]:
        sock = ctx.socket(kind)
        if curve:
            public, secret = zmq.curve_keypair()
            sock.curve_serverkey = server.client.link.keys.server_public
            sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.connect(address)
        socks.append(sock)
        return sock

    yield make
    for sock in socks:
        sock.close(linger=0)
    ctx.term()


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 6, **extra}


def test_a_foreign_reader_gets_no_prompt(server: ServerHarness, foreign: Any) -> None:
    alone = baseline(server.base_url)
    readers = [foreign(zmq.PULL, server.client.link.to_engine, curve) for curve in (False, True)]
    time.sleep(0.3)  # the handshakes fail now, before any request
    for i in range(6):  # PUSH would hand every other one to a second peer
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=chat(f"{SECRET} {i}"), timeout=10)
        assert r.status_code == 200, r.text
    assert_serving(server.base_url, alone)
    for reader in readers:
        assert not reader.poll(300), "a foreign socket received a command meant for the engine"
    assert_idle(server.base_url)


def _in_flight_id(base_url: str) -> str:
    deadline = time.monotonic() + 3
    while True:
        live = [r for r in httpx.get(f"{base_url}/v1/requests").json()["data"] if r["status"] != "finished"]
        if live:
            return str(live[0]["id"])
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_foreign_writer_injects_nothing_and_kills_nothing(server: ServerHarness, foreign: Any) -> None:
    alone = baseline(server.base_url)
    writers = [foreign(zmq.PUSH, server.client.link.from_engine, curve) for curve in (False, True)]
    encode = msgspec.msgpack.Encoder().encode
    text = ""
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions",
                      json={**chat("[[hang]]"), "max_tokens": 400, "stream": True}, timeout=10) as r:
        lines = r.iter_lines()
        text += next(lines)
        rid = _in_flight_id(server.base_url)
        forged = RequestOutput(request_id=rid, token_ids=[1], text=" INJECTED", num_output_tokens=1)
        for writer in writers:  # each send waits for a peer, which the failed handshake never gives
            writer.sndtimeo = 200
            for forgery in (EngineOutputs([forged]), EngineError(message="forged death", fatal=True)):
                with contextlib.suppress(zmq.Again):
                    writer.send(encode(forgery))
        for _ in range(40):  # ~0.4 s of genuine tokens while the forgeries are refused
            text += next(lines)
        assert_serving(server.base_url, alone)
    assert "INJECTED" not in text
    assert server.client.state.value == "ready" and not server.dead
    assert_idle(server.base_url)


def test_refusals_are_logged_at_most_once_a_minute(make_scripted: MakeServer, caplog: pytest.LogCaptureFixture) -> None:
    fresh = make_scripted()  # its own rate limiter: nothing logged yet
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        with caplog.at_level(logging.WARNING, logger="edgemoe.link_auth"):
            for _ in range(5):
                sock = ctx.socket(zmq.PUSH)
                sock.connect(fresh.client.link.from_engine)
                time.sleep(0.1)
                sock.close(linger=0)
            deadline = time.monotonic() + 2
            while not any(r.name == "edgemoe.link_auth" for r in caplog.records) and time.monotonic() < deadline:
                time.sleep(0.02)
        lines = [r.getMessage() for r in caplog.records if r.name == "edgemoe.link_auth"]
        assert len(lines) == 1 and "refused" in lines[0], lines
    finally:
        ctx.term()


def test_keys_round_trip_through_an_inherited_socket() -> None:
    keys = EngineKeys(b"s" * 40, b"p" * 40, b"x" * 40)
    theirs = hand_over(keys)
    assert receive_keys(theirs.detach()) == keys


@pytest.mark.parametrize("engine_gone", [False, True], ids=["a-foreign-peer", "the-engine-dying"])
def test_a_handshake_cut_while_the_engine_dies_is_not_called_a_refusal(engine_gone: bool,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A peer that begins the handshake and goes (a greeting's first bytes, then closed: what
    an engine failing as it loads does to its link) is a refusal while the engine lives; while
    the engine is gone it is the engine's own, whose error says why: no warning."""
    import asyncio
    import shutil
    import socket
    import tempfile

    import zmq.asyncio

    from edgemoe.link_auth import LinkGuard, LinkKeys

    where = tempfile.mkdtemp(prefix="eml", dir="/tmp")  # ipc paths stop at ~100 bytes

    async def scenario() -> list[str]:
        ctx: zmq.Context[Any] = zmq.Context()
        actx = zmq.asyncio.Context.shadow(ctx.underlying)
        guard = LinkGuard(ctx, LinkKeys.generate())
        sock = ctx.socket(zmq.PULL)
        guard.secure(sock)
        sock.bind(f"ipc://{where}/link.sock")
        report = asyncio.create_task(guard.report_refusals(actx, [sock], lambda: engine_gone))
        try:
            with caplog.at_level(logging.DEBUG, logger="edgemoe.link_auth"):
                await asyncio.sleep(0.1)  # the monitor in place
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
                    peer.connect(f"{where}/link.sock")
                    peer.sendall(b"\xff" + b"\x00" * 8 + b"\x7f")  # ZMTP's signature, no more
                    await asyncio.sleep(0.1)
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline and not any(r.name == "edgemoe.link_auth" for r in caplog.records):
                    await asyncio.sleep(0.05)
        finally:
            report.cancel()
            await asyncio.gather(report, return_exceptions=True)
            sock.close(linger=0)
            guard.stop()
            ctx.term()
        return [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name == "edgemoe.link_auth"]

    try:
        lines = asyncio.run(scenario())
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert lines, "the cut handshake was not seen"
    if engine_gone:
        assert all(line.startswith("DEBUG") for line in lines), lines
    else:
        assert any(line.startswith("WARNING") and "refused" in line for line in lines), lines
