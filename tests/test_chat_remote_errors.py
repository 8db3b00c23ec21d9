"""`edgemoe chat --url`: a server that is not there, or that goes away in the middle of an
answer, is one line from the chat (the program goes on or exits 2), never a traceback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgemoe.chat_backends import Answer, RemoteBackend, Sampling
from edgemoe.cli import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_server_there_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    assert main(["chat", "--url", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"edgemoe chat: error: cannot reach http://127.0.0.1:{port}" in err and "Traceback" not in err


class _Dying(BaseHTTPRequestHandler):
    """Answers the engine probe, then starts a stream and drops the connection mid-chunk."""

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"served_model_name": "m", "random_weights": True}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", "100000")  # promises more than it sends
        self.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "hel"}}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dying() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_gone_mid_answer_is_a_value_error_after_the_text_so_far(dying: str) -> None:
    backend = RemoteBackend(dying, None, Sampling(16, None, None))
    pieces = []
    with pytest.raises(ValueError, match=f"cannot reach {dying}"):
        for piece in backend.stream([{"role": "user", "content": "hi"}], Answer()):
            pieces.append(piece.text)
    assert pieces == ["hel"]
    backend.close()
