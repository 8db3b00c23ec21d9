"""Error answers: shapes and statuses the SDKs understand (never 422), auth, limits, engine death."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from server_harness import MakeServer, ServerHarness

from edgemoe.server.app import create_app
from edgemoe.server.config import ServerConfig
from edgemoe.server.engine_client import EngineClient, EngineLink

USER = [{"role": "user", "content": "hi"}]


def post(h: ServerHarness, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{h.base_url}{path}", json=body, timeout=30, **kwargs)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": USER, "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": USER, "temperature": -1}, "temperature"),
        ({"model": "m", "messages": USER, "top_p": 0}, "top_p"),
        ({"model": "m", "messages": USER, "n": 0}, "n"),
        ({"model": "m", "messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"model": "m", "messages": USER, "tools": [{"type": "function"}]}, "tools[0]"),
    ],
)
def test_validation_errors_are_400(scripted: ServerHarness, body: dict[str, Any], param: str) -> None:
    error = assert_error(post(scripted, "/v1/chat/completions", body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param)


def test_invalid_json_and_non_object_bodies(scripted: ServerHarness) -> None:
    for content in (b"{not json", b"[1, 2]", b""):
        r = httpx.post(f"{scripted.base_url}/v1/chat/completions", content=content,
                       headers={"content-type": "application/json"})
        assert_error(r, 400)


def test_sdk_raises_bad_request(scripted: ServerHarness) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        scripted.openai().chat.completions.create(model="m", messages=USER, temperature=-1)
    assert err.value.status_code == 400 and err.value.body["param"] == "temperature"


def test_prompt_over_the_context_names_both_numbers(scripted: ServerHarness) -> None:
    long = "word " * 5000
    for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}),
                       ("/v1/completions", {"prompt": long})]:
        error = assert_error(post(scripted, path, {"model": "m", **body}), 400)
        assert "the context length is 4096" in error["message"] and "the prompt has" in error["message"]
        assert error["code"] == "context_length_exceeded"
        n_tokens = int(error["message"].split("the prompt has ")[1].split()[0])
        assert n_tokens > 4096


def test_unknown_fields_are_ignored(scripted: ServerHarness) -> None:
    full = scripted.openai().chat.completions.create(
        model="m", messages=USER, max_tokens=2, store=False, metadata={"a": "b"}, user="u",
        extra_body={"prompt_cache_key": "k", "some_future_field": {"x": 1}},
    )
    assert full.choices[0].finish_reason == "length"


def test_image_content_is_refused(scripted: ServerHarness) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for messages in ([{"role": "user", "content": [{"type": "text", "text": "see"}, image]}],
                     [{"role": "system", "content": [image]}, *USER]):
        error = assert_error(post(scripted, "/v1/chat/completions", {"model": "m", "messages": messages}), 400)
        assert "image" in error["message"] and "base64" not in error["message"]


def test_unknown_route_and_method(scripted: ServerHarness) -> None:
    assert_error(httpx.get(f"{scripted.base_url}/v1/nothing"), 404)
    assert_error(httpx.get(f"{scripted.base_url}/v1/chat/completions"), 405)


def test_body_size_limit(make_scripted: MakeServer) -> None:
    h = make_scripted(max_body_size=4096)
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    error = assert_error(post(h, "/v1/chat/completions", big), 413)
    assert "4096" in error["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    r = httpx.post(f"{h.base_url}/v1/chat/completions", content=chunked(),
                   headers={"content-type": "application/json"})
    assert_error(r, 413)
    assert post(h, "/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 1}).status_code == 200


def test_api_key(make_scripted: MakeServer) -> None:
    h = make_scripted(api_key="sekret")
    assert httpx.get(f"{h.base_url}/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": "sekret"}):
        assert_error(httpx.get(f"{h.base_url}/v1/models", headers=headers), 401)
        assert_error(post(h, "/v1/chat/completions", {"model": "m", "messages": USER}, headers=headers), 401)
    with pytest.raises(openai.AuthenticationError):
        h.openai(api_key="wrong").chat.completions.create(model="m", messages=USER)
    assert h.openai(api_key="sekret").models.list().data
    assert httpx.get(f"{h.base_url}/v1/models", headers={"x-api-key": "sekret"}).status_code == 200
    assert httpx.get(f"{h.base_url}/v1/models", headers={"Authorization": "bearer sekret"}).status_code == 200


def test_strict_model_name(make_scripted: MakeServer, demo_dir: Any) -> None:
    h = make_scripted(strict_model_name=True, served_model_name="edge")
    client = h.openai()
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert err.value.body["code"] == "model_not_found"
    assert client.chat.completions.create(model="edge", messages=USER, max_tokens=1).model == "edge"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    assert client.models.retrieve("edge").id == "edge"
    assert_error(post(h, "/v1/completions", {"model": "other", "prompt": "x"}), 404)
    assert_error(post(h, "/v1/tokenize", {"model": "other", "prompt": "x"}), 404)


def test_engine_death_fails_open_requests_with_503(make_scripted: MakeServer) -> None:
    h = make_scripted()
    client = h.openai()
    hang = [{"role": "user", "content": "[[hang]]"}]
    stream = client.chat.completions.create(model="m", messages=hang, stream=True)
    next(iter(stream))  # the stream is open
    results: dict[str, BaseException | None] = {}

    def blocking() -> None:
        try:
            client.chat.completions.create(model="m", messages=hang)
            results["plain"] = None
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            results["plain"] = exc

    waiter = threading.Thread(target=blocking)
    waiter.start()
    deadline = time.monotonic() + 10
    while len(h.engine.requests) < 2:  # both in flight
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    with pytest.raises(openai.InternalServerError) as crash:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[crash]]"}])
    assert crash.value.status_code == 503
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    waiter.join(5)
    assert isinstance(results["plain"], openai.InternalServerError) and results["plain"].status_code == 503
    assert time.monotonic() - t0 < 3
    health = httpx.get(f"{h.base_url}/health")
    assert health.status_code == 503 and "engine" in health.json()["error"]["message"]
    assert_error(post(h, "/v1/chat/completions", {"model": "m", "messages": USER}), 503)
    assert h.dead and "scripted crash" in h.dead[0]


def test_loading_answers_503() -> None:
    """Before the engine reports ready: /health and every API route say 503."""
    with tempfile.TemporaryDirectory(prefix="em-") as tmp:
        app = create_app(ServerConfig(), EngineClient(EngineLink.in_dir(Path(tmp))))  # no engine at all
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            while not server.started:
                time.sleep(0.01)
            url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
            assert "loading" in assert_error(httpx.get(f"{url}/health"), 503)["message"]
            assert_error(httpx.get(f"{url}/v1/models"), 503)
            assert_error(httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": USER}), 503)
        finally:
            server.should_exit = True
            thread.join(10)
