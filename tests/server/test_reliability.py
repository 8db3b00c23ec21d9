"""Cancellation mid-prefill, request timeouts, the bounded queue (429/529 + Retry-After),
device out-of-memory (503 / error event, and the server serves on), and the security
basics (loopback default, no request field reaching the filesystem)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ops_support import OOM_MESSAGE, metrics, start_ops_server
from server_harness import ServerHarness

from edgemoe.server.config import ServerConfig
from edgemoe.tokenizer import TokenizerBundle


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def wait_for(predicate: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def ops(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_ops_server(demo_dir, demo_tokenizer)
    yield harness
    harness.stop()


def sse_events(r: httpx.Response) -> list[Any]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


# --------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_mid_prefill_aborts_within_a_step(ops: ServerHarness, stream: bool) -> None:
    engine = ops.engine
    before = list(engine.aborted_in_prefill)
    with pytest.raises(httpx.ReadTimeout):  # gives up before the first byte, closing the connection
        httpx.post(f"{ops.base_url}/v1/chat/completions", json=chat("[[prefill]]", stream=stream), timeout=0.3)
    t0 = time.monotonic()
    wait_for(lambda: not engine.requests, timeout=1.0)
    assert time.monotonic() - t0 < 0.5
    assert len(engine.aborted_in_prefill) == len(before) + 1  # still prefilling when aborted
    wait_for(lambda: httpx.get(f"{ops.base_url}/v1/stats").json()["requests"]["queued"] == 0, timeout=1.0)
    pool = httpx.get(f"{ops.base_url}/v1/stats").json()["engine"]["kv_pool"]
    assert pool["pages_free"] == pool["pages_total"]  # its pages came back


# --------------------------------------------------------------------------- timeouts


def test_request_timeout(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> None:
    h = start_ops_server(demo_dir, demo_tokenizer, request_timeout=0.4)
    try:
        t0 = time.monotonic()
        r = httpx.post(f"{h.base_url}/v1/chat/completions", json=chat("[[hang]]"), timeout=10)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        assert 0.4 <= time.monotonic() - t0 < 1.5
        wait_for(lambda: not h.engine.requests, timeout=1.0)  # aborted in the engine
        streamed = httpx.post(f"{h.base_url}/v1/chat/completions", json=chat("[[hang]]", stream=True), timeout=10)
        events = sse_events(streamed)
        assert streamed.status_code == 200 and events[-1]["error"]["code"] == "request_timeout"
        assert any(e.get("choices") and e["choices"][0]["delta"].get("content") for e in events)  # it did stream
        assert "[DONE]" not in streamed.text
        # Mid-prefill (no first token yet): a plain 504 even when streaming was asked for.
        r = httpx.post(f"{h.base_url}/v1/chat/completions", json=chat("[[prefill]]", stream=True), timeout=10)
        assert r.status_code == 504
        wait_for(lambda: not h.engine.requests, timeout=1.0)
        finished = httpx.get(f"{h.base_url}/v1/requests").json()["data"]
        assert [e["finish_reason"] for e in finished[:3]] == ["timeout"] * 3
        # Quick requests are untouched.
        assert h.openai().chat.completions.create(**chat("hi", max_tokens=3)).choices[0].finish_reason == "length"
    finally:
        h.stop()


# --------------------------------------------------------------------------- overload


def _in_background(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_bounded_queue_answers_429_with_retry_after(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> None:
    h = start_ops_server(demo_dir, demo_tokenizer, max_queued_requests=2)
    try:
        results: list[int] = []
        slow = [_in_background(lambda: results.append(httpx.post(
            f"{h.base_url}/v1/chat/completions", json=chat("[[prefill]]", max_tokens=2), timeout=30).status_code))
            for _ in range(2)]
        wait_for(lambda: len(h.engine.requests) == 2)
        r = httpx.post(f"{h.base_url}/v1/chat/completions", json=chat("hi"), timeout=10)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded" and "overloaded" in r.json()["error"]["message"]
        with pytest.raises(openai.RateLimitError):
            h.openai().completions.create(model="m", prompt="x", max_tokens=2)
        anthropic = httpx.post(f"{h.base_url}/v1/messages", timeout=10, json={
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        if anthropic.status_code != 404:  # the Messages API is served
            assert anthropic.status_code == 529 and anthropic.json()["error"]["type"] == "overloaded_error"
            assert int(anthropic.headers["retry-after"]) >= 1
        for thread in slow:
            thread.join(30)
        assert results == [200, 200]  # the queued ones were served
        assert h.openai().chat.completions.create(**chat("hi", max_tokens=2)).choices  # room again
    finally:
        h.stop()


def test_an_empty_queue_admits_any_n(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> None:
    h = start_ops_server(demo_dir, demo_tokenizer, max_queued_requests=1)
    try:
        reply = h.openai().chat.completions.create(**chat("hi", max_tokens=2, n=3))
        assert len(reply.choices) == 3
    finally:
        h.stop()


# --------------------------------------------------------------------------- device out of memory


def test_device_oom_is_a_clear_503_and_the_server_serves_on(ops: ServerHarness) -> None:
    client = ops.openai()
    for prompt in ("[[oom]]", "[[oom0]]"):
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(**chat(prompt))
        assert err.value.status_code == 503
        assert err.value.body["code"] == "generation_failed" and "out of memory" in err.value.body["message"]
    # Streamed: the tokens before the failing step, then an error event the SDK raises.
    pieces: list[str] = []
    with pytest.raises(openai.APIError, match="out of memory"):
        for chunk in client.chat.completions.create(**chat("[[oom]]"), stream=True):
            pieces.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(pieces)
    # Failing before the first token: a plain 503 even when streaming.
    r = httpx.post(f"{ops.base_url}/v1/chat/completions", json=chat("[[oom0]]", stream=True))
    assert r.status_code == 503 and OOM_MESSAGE in r.json()["error"]["message"]
    assert client.chat.completions.create(**chat("hi", max_tokens=3)).choices[0].finish_reason == "length"
    errors = metrics(httpx.get(f"{ops.base_url}/metrics").text)["edgemoe:request_success_total"]
    assert sum(v for k, v in errors.items() if ("finished_reason", "error") in k) >= 4


# --------------------------------------------------------------------------- security basics


def test_loopback_by_default() -> None:
    from edgemoe.cli import build_parser, server_settings

    assert ServerConfig().host == "127.0.0.1"
    args = build_parser().parse_args(["serve"])
    assert ServerConfig(**server_settings(args)).host == "127.0.0.1"


MARK = "fsprobe-7d1c"


def test_no_request_field_reaches_the_filesystem(ops: ServerHarness, tmp_path: Path) -> None:
    """Every file-system call the server makes while serving requests full of path-like
    values is recorded (audit hooks); none may name any of those values."""
    seen: list[str] = []
    armed = threading.Event()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if armed.is_set() and (event == "open" or event.startswith(("os.", "shutil.", "pathlib."))):
            seen.append(f"{event} {args!r}")

    sys.addaudithook(hook)  # NOTE: hooks cannot be removed; `armed` turns this one off
    paths = [f"../../{MARK}", f"/tmp/{MARK}", f"~/{MARK}", f"file:///{MARK}", f"{MARK}/../../etc/passwd"]
    armed.set()
    (tmp_path / MARK).write_text("x")  # the control: the hook does see such a call
    assert [s for s in seen if MARK in s]
    seen.clear()
    try:
        for p in paths:
            body = chat(p, max_tokens=2, tools=[{"type": "function", "function": {"name": p[:60].replace("/", "_")}}],
                        chat_template_kwargs={"template": p, "path": p})
            httpx.post(f"{ops.base_url}/v1/chat/completions", json={**body, "model": p})
            httpx.post(f"{ops.base_url}/v1/completions", json={"model": p, "prompt": p, "max_tokens": 2})
            httpx.post(f"{ops.base_url}/v1/tokenize", json={"model": p, "prompt": p})
            httpx.get(f"{ops.base_url}/v1/models/{p}")
            httpx.post(f"{ops.base_url}/v1/messages", json={"model": p, "max_tokens": 2, "system": p,
                                                              "messages": [{"role": "user", "content": p}]})
            httpx.post(f"{ops.base_url}/v1/responses", json={"model": p, "input": p, "instructions": p})
    finally:
        armed.clear()
    assert not [s for s in seen if MARK in s]
