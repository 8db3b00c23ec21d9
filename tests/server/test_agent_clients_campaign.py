"""Regressions of the agent-client campaign: requests Claude Code, Codex and OpenCode (and
the SDKs they build on) really send, answered in the shape they parse.

- A prompt over the context, on /v1/messages: Anthropic's own wording "prompt is too long:
  N tokens > M maximum", which Claude Code (it compacts) and OpenCode match on; the
  Anthropic body has no error code to go by.
- `GET /v1/models` from an Anthropic client (`anthropic-version`): Anthropic's model list,
  which Claude Code's gateway model discovery and the SDK's `models.list()` read.
- `null` for the nullable `stream` / `n` / `logprobs` / `echo`: the default, not a 400.
- A bad field named as the client wrote it: an Anthropic text block without its text, an
  empty Responses `input`; a compressed body by its Content-Encoding, not as "not valid JSON".
"""

from __future__ import annotations

import re
from typing import Any

import anthropic
import httpx
import pytest
from agents_support import call, strict
from anthropic.types import ModelInfo
from openai.types import Model
from openai.types.chat import ChatCompletion
from server_harness import ServerHarness

TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum")
CONTEXT = 4096  # the scripted engine's context length


def anthropic_client(server: ServerHarness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


def big(words: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "word " * words}]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_prompt_over_the_context_is_prompt_is_too_long(scripted: ServerHarness, stream: bool) -> None:
    sdk = anthropic_client(scripted)
    counted = call(sdk.messages.count_tokens, model="m", messages=big(6000)).input_tokens
    with pytest.raises(anthropic.BadRequestError) as err:
        call(sdk.messages.create, model="m", max_tokens=10, messages=big(6000), stream=stream)
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    found = TOO_LONG.match(body["error"]["message"])  # type: ignore[index]
    assert found is not None, body
    # The gap the client must cut: the prompt's tokens against the largest prompt that fits.
    assert (int(found[1]), int(found[2])) == (counted, CONTEXT - 1)


def test_anthropic_prompt_counted_only_up_to_the_limit_keeps_the_wording(scripted: ServerHarness) -> None:
    r = httpx.post(f"{scripted.base_url}/v1/messages?beta=true", timeout=30,
                   json={"model": "m", "max_tokens": 10, "messages": big(300_000)})
    assert r.status_code == 400
    found = TOO_LONG.match(r.json()["error"]["message"])
    assert found is not None and int(found[1]) > int(found[2]) == CONTEXT - 1


def test_openai_prompt_over_the_context_keeps_its_code(scripted: ServerHarness) -> None:
    r = httpx.post(f"{scripted.base_url}/v1/chat/completions", timeout=30,
                   json={"model": "m", "messages": big(6000)})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "the context length is 4096" in error["message"]


def test_models_in_anthropic_shape_for_anthropic_clients(scripted: ServerHarness) -> None:
    sdk = anthropic_client(scripted)
    listed = call(sdk.models.list, limit=1000)
    assert listed.has_more is False and len(listed.data) == 1
    card = strict(ModelInfo, listed.data[0].model_dump(exclude_unset=True))
    assert card.type == "model" and card.display_name == card.id and card.max_input_tokens == CONTEXT
    assert (listed.first_id, listed.last_id) == (card.id, card.id)
    one = call(sdk.models.retrieve, "claude-local")
    assert strict(ModelInfo, one.model_dump(exclude_unset=True)).id == "claude-local"
    # What Claude Code's discovery sends: the same shape, whatever the query string.
    raw = httpx.get(f"{scripted.base_url}/v1/models?limit=1000", headers={"anthropic-version": "2023-06-01"}).json()
    assert raw["data"][0]["type"] == "model" and "object" not in raw


def test_models_stay_in_openai_shape_for_openai_clients(scripted: ServerHarness) -> None:
    models = call(scripted.openai().models.list).data
    assert len(models) == 1 and strict(Model, models[0].model_dump(exclude_unset=True)).object == "model"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi [[unicode]]"}],
                              "stream": None, "n": None, "logprobs": None}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "echo": None, "stream": None}),
    ("/v1/responses", {"input": "hi [[unicode]]", "stream": None}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi [[unicode]]"}], "max_tokens": 50, "stream": None}),
])
def test_null_means_the_default(scripted: ServerHarness, path: str, body: dict[str, Any]) -> None:
    r = httpx.post(f"{scripted.base_url}{path}", json={"model": "m", **body}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.text
    if path == "/v1/chat/completions":
        completion = strict(ChatCompletion, r.json())
        assert len(completion.choices) == 1 and completion.choices[0].logprobs is None


@pytest.mark.parametrize(("path", "body", "param"), [
    # an Anthropic text block without its text: named as such, not "unsupported block type 'text'"
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 5},
     "messages.0.content.0.text"),
    ("/v1/messages", {"system": [{"type": "text", "text": 3}], "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 5}, "system.0.text"),
    # an empty Responses input: the field the client wrote, not the chat route's `messages`
    ("/v1/responses", {"input": []}, "input"),
])
def test_a_bad_field_is_named_as_the_client_wrote_it(scripted: ServerHarness, path: str, body: dict[str, Any],
                                                      param: str) -> None:
    r = httpx.post(f"{scripted.base_url}{path}", json={"model": "m", **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path == "/v1/messages":
        assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{param}:"), error
        assert "unsupported content block" not in error["message"]
    else:
        assert error["param"] == param and "messages" not in error["message"], error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_compressed_body_is_refused_naming_its_encoding(scripted: ServerHarness, path: str) -> None:
    import gzip
    import json

    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{scripted.base_url}{path}", content=gzip.compress(json.dumps(body).encode()), timeout=30,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "Content-Encoding 'gzip'" in message and "JSON" not in message, message
    ok = httpx.post(f"{scripted.base_url}{path}", json=body, timeout=30, headers={"content-encoding": "identity"})
    assert ok.status_code == 200, ok.text
