"""Clients that go away: their engine requests are aborted, streamed or not."""

from __future__ import annotations

import time

import httpx
import pytest
from server_harness import MakeServer, ServerHarness

HANG = {"model": "m", "messages": [{"role": "user", "content": "[[hang]]"}]}


def wait_idle(h: ServerHarness, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while h.engine.requests:
        assert time.monotonic() < deadline, "the engine still runs a request nobody waits for"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server(make_scripted: MakeServer) -> ServerHarness:
    return make_scripted()


def test_closed_stream_is_aborted(server: ServerHarness) -> None:
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json={**HANG, "stream": True}) as r:
        # NOTE: keep the line iterator alive: a dropped one closes the connection when
        # it is garbage-collected, which is the very disconnect under test.
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert server.engine.requests  # still generating while we read
    wait_idle(server)


def test_non_streamed_request_of_a_gone_client_is_aborted(server: ServerHarness) -> None:
    hang_completion = {"model": "m", "prompt": "[[hang]]", "max_tokens": 3000}
    for path, body in [("/v1/chat/completions", HANG), ("/v1/completions", hang_completion)]:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}{path}", json=body, timeout=0.5)
        wait_idle(server)
