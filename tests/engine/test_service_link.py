"""The engine's end of the link (`engine/service.py: _Sockets`): it announces itself only
once its command socket has finished the CURVE handshake with the server's. The server
sends commands without blocking and takes "ready" as "the engine can be sent to"; a ready
engine whose command link was still connecting made the next request a 503 ("cannot reach
the engine: Resource temporarily unavailable", a CI run's scripted engine, ready at once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

from edgemoe.engine.service import _Sockets
from edgemoe.link_auth import LinkKeys


def test_the_command_link_is_up_when_the_engine_end_is_made(tmp_path: Path) -> None:
    keys = LinkKeys.generate()
    ctx: zmq.Context[Any] = zmq.Context()
    to_engine, from_engine = f"ipc://{tmp_path}/to", f"ipc://{tmp_path}/from"
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    for sock in (push, pull):
        sock.curve_server = True
        sock.curve_secretkey = keys.server_secret
    push.bind(to_engine)
    pull.bind(from_engine)
    engine_end = _Sockets(to_engine, from_engine, keys.engine_keys())
    try:
        assert push.poll(0, zmq.POLLOUT), "the engine end returned before its command link was up"
        push.send(b"ping", zmq.NOBLOCK)  # what the server does right after "ready": no zmq.Again
        assert engine_end.commands.poll(2000) and engine_end.commands.recv() == b"ping"
    finally:
        engine_end.close()
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
