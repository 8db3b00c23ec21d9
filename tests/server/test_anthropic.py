"""`POST /v1/messages` and `/v1/messages/count_tokens` through the real `anthropic` SDK (and raw
HTTP for the wire shape), against the real app over the scripted engine: text, streams,
tool turns, thinking, stop reasons, usage, count_tokens, the billing line, errors.
Every payload is validated strictly against the SDK types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from agents_support import (
    ANSWER,
    FAIL_AFTER,
    WEATHER_SCHEMA,
    call,
    last_prompt,
    start_caching_server,
    strict,
)
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from server_harness import ServerHarness
from server_scripts import SCRIPTS

from edgemoe.server.errors import Overloaded
from edgemoe.tokenizer import TokenizerBundle

WEATHER = {"name": "get_weather", "description": "Weather forecast for a city", "input_schema": WEATHER_SCHEMA,
           "cache_control": {"type": "ephemeral"}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
THINK = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def server(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_caching_server(demo_dir, demo_tokenizer)
    yield harness
    harness.stop()


def client(server: ServerHarness, **kwargs: Any) -> anthropic.Anthropic:
    kwargs.setdefault("api_key", "unused")
    return anthropic.Anthropic(base_url=server.base_url, max_retries=0, timeout=30, **kwargs)


def ask(script: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Go. [[{script}]]"}]


def post(server: ServerHarness, body: dict[str, Any], path: str = "/v1/messages", **kwargs: Any) -> httpx.Response:
    full = {"model": "claude-x", "max_tokens": 200, **body}
    return httpx.post(f"{server.base_url}{path}", json=full, timeout=30, **kwargs)


def raw_events(server: ServerHarness, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a streamed message, checked against its `event:` line and the SDK type."""
    events: list[dict[str, Any]] = []
    full = {"model": "claude-x", "max_tokens": 200, "stream": True, **body}
    with httpx.stream("POST", f"{server.base_url}/v1/messages?beta=true", json=full, timeout=30) as r:
        assert r.status_code == 200
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == name
                events.append(event)
    for event in events:
        if event["type"] not in ("ping", "error"):
            strict(RawMessageStreamEvent, event)
    return events


def test_text_non_streamed(server: ServerHarness) -> None:
    message = strict(Message, post(server, {"messages": ask("unicode")}).json())
    assert message.id.startswith("msg_") and message.model == "claude-x"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == SCRIPTS["unicode"]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0 and usage.cache_creation_input_tokens == 0
    sdk = call(client(server).messages.create, model="claude-x", max_tokens=200, messages=ask("unicode"))
    assert sdk.content[0].text == SCRIPTS["unicode"]


def test_stream_events_and_final_message(server: ServerHarness) -> None:
    body = {"messages": ask("tool"), "tools": [WEATHER], "thinking": THINK, "max_tokens": 2000}
    events = raw_events(server, body)
    types = [e["type"] for e in events]
    assert types[:2] == ["message_start", "ping"] and types[-2:] == ["message_delta", "message_stop"]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]["input_tokens"] > 0
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "tool_use"]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    thinking = [e for e in events if e.get("index") == 0]
    assert thinking[-2]["delta"]["type"] == "signature_delta" and thinking[-2]["delta"]["signature"]
    assert thinking[-1]["type"] == "content_block_stop"
    partial = "".join(e["delta"]["partial_json"] for e in events if e.get("index") == 1 and e["type"] == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris", "days": 3}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}

    sdk = client(server)
    full = call(sdk.messages.create, model="claude-x", messages=ask("tool"), tools=[WEATHER], thinking=THINK, max_tokens=2000)
    with call(sdk.messages.stream, model="claude-x", messages=ask("tool"), tools=[WEATHER], thinking=THINK,
              max_tokens=2000) as stream:
        streamed = call(stream.get_final_message)
    for message in (full, streamed):
        assert message.stop_reason == "tool_use"
        thought, use = message.content
        assert thought.type == "thinking" and thought.thinking == "I should call the weather tool." and thought.signature
        assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris", "days": 3}
        assert use.id.startswith("toolu_")
    assert full.usage.output_tokens == streamed.usage.output_tokens


def test_tool_turns_with_thinking_history(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    """call → tool_result → answer, with the history as Claude Code resends it."""
    sdk = client(server)
    first = call(sdk.messages.create, model="claude-x", max_tokens=2000, messages=ask("tool"), tools=[WEATHER, TIME],
                 thinking=THINK, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    use = first.content[-1]
    history: list[Any] = [
        *ask("tool"),
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": first.content[0].thinking, "signature": "any-signature-at-all"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "sunny, 21C [[answer]]"}]},
            {"type": "text", "text": "Thanks.", "cache_control": {"type": "ephemeral"}},
        ]},
    ]
    with call(sdk.messages.stream, model="claude-x", max_tokens=2000, messages=history, tools=[WEATHER, TIME],
              thinking=THINK) as stream:
        final = call(stream.get_final_message)
    assert final.stop_reason == "end_turn" and [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == ANSWER
    prompt = last_prompt(server, demo_tokenizer)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21C [[answer]]\n</tool_response><|im_end|>\n<|im_start|>user\nThanks." in prompt
    assert "opaque" not in prompt


def test_tool_result_error_and_string_content(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    history = [*ask("tool"), {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                                "input": {"city": "Rome"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no network",
                                             "is_error": True}]}]
    assert post(server, {"messages": history, "tools": [WEATHER]}).status_code == 200
    assert "<tool_response>\nError: no network\n</tool_response>" in last_prompt(server, demo_tokenizer)


@pytest.fixture(scope="module")
def thinking_off(make_scripted: Any) -> ServerHarness:
    return make_scripted(default_thinking_mode="off")


@pytest.mark.parametrize(("thinking", "default", "expected"), [
    (None, "on", True), ({"type": "disabled"}, "on", False), (THINK, "off", True),
    ({"type": "adaptive"}, "off", True), (None, "off", False),
])
def test_thinking_wins_over_the_default(server: ServerHarness, thinking_off: ServerHarness, demo_tokenizer: TokenizerBundle,
                                        thinking: dict[str, Any] | None, default: str, expected: bool) -> None:
    harness = server if default == "on" else thinking_off
    body = {"messages": ask("think"), "max_tokens": 2000, **({"thinking": thinking} if thinking else {})}
    message = strict(Message, post(harness, body).json())
    assert last_prompt(harness, demo_tokenizer).endswith("<think>\n\n</think>\n\n") != expected
    if expected:
        assert [(b.type, getattr(b, "thinking", None)) for b in message.content][0] == (
            "thinking", "The user wants a number. 6 times 7.")
        assert message.content[1].text == "The answer is 42."
    else:
        assert [b.type for b in message.content] == ["text"] and message.content[0].text == SCRIPTS["think"]


def test_stop_reasons(server: ServerHarness) -> None:
    sdk = client(server)
    stopped = call(sdk.messages.create, model="claude-x", max_tokens=200, messages=ask("stops"), stop_sequences=["STOP"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
    assert stopped.content[0].text == "one two three "
    events = raw_events(server, {"messages": ask("stops"), "stop_sequences": ["STOP", "nope"]})
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    short = call(sdk.messages.create, model="claude-x", max_tokens=3, messages=ask("unicode"))
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_usage_reports_cached_tokens(server: ServerHarness) -> None:
    sdk = client(server)
    history = [{"role": "user", "content": "A long shared preamble. " * 20 + "[[unicode]]"}]
    call(sdk.messages.create, model="claude-x", max_tokens=100, messages=history)
    longer = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    again = call(sdk.messages.create, model="claude-x", max_tokens=100, messages=longer)
    cached = server.engine.last_cached()  # type: ignore[attr-defined]
    prompt_tokens = len(server.engine.seen[-1][0])
    assert again.usage.cache_read_input_tokens == cached > 100
    assert again.usage.input_tokens == prompt_tokens - cached
    with call(sdk.messages.stream, model="claude-x", max_tokens=100, messages=longer) as stream:
        streamed = call(stream.get_final_message)
    assert streamed.usage.cache_read_input_tokens == server.engine.last_cached() == prompt_tokens  # type: ignore[attr-defined]
    assert streamed.usage.input_tokens == 0


@pytest.mark.parametrize("body", [
    {"messages": ask("think")},
    {"messages": ask("think"), "thinking": {"type": "disabled"}},
    {"messages": ask("tool"), "tools": [WEATHER, TIME], "thinking": THINK, "system": "Be brief."},
    {"messages": ask("tool"), "tools": [WEATHER], "tool_choice": {"type": "none"}},
    {"messages": [*ask("think"), {"role": "assistant", "content": "The answer"}]},
])
def test_count_tokens_is_the_prompt_a_request_sends(server: ServerHarness, body: dict[str, Any]) -> None:
    sdk = client(server)
    count = call(sdk.messages.count_tokens, model="claude-x", **body)
    strict(MessageTokensCount, count.model_dump())
    call(sdk.messages.create, model="claude-x", max_tokens=2000, **body)
    assert count.input_tokens == len(server.engine.seen[-1][0])
    beta = post(server, body, path="/v1/messages/count_tokens?beta=true")
    assert beta.json() == {"input_tokens": count.input_tokens}


def test_billing_line_is_stripped(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    prompts = []
    for n in (1, 2):
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.{n}.abc; cc_entrypoint=cli; cch={n}00;"},
                  {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
        assert post(server, {"messages": ask("unicode"), "system": system}).status_code == 200
        prompts.append(server.engine.seen[-1][0])
    assert prompts[0] == prompts[1]
    text = demo_tokenizer.decode(prompts[0])
    assert text.startswith("<|im_start|>system\nYou are Claude Code.<|im_end|>") and "billing" not in text


def test_prefill_continues_the_assistant_text(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    body = {"messages": [*ask("unicode"), {"role": "assistant", "content": [{"type": "text", "text": "Sure:"}]}]}
    message = strict(Message, post(server, body).json())
    assert last_prompt(server, demo_tokenizer).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nSure:")
    assert message.content[0].text == SCRIPTS["unicode"]


# --------------------------------------------------------------------------- errors


def error_of(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


@pytest.mark.parametrize(("body", "needle"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"model": None}, "model"),
    ({"messages": []}, "at least one message"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]}, "text-only"),
    ({"messages": [{"role": "user", "content": [{"type": "weird"}]}]}, "weird"),
    ({"messages": [*ask("x"), {"role": "assistant", "content": "trailing "}]}, "trailing whitespace"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "1024"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4000}, "max_tokens": 4000}, "greater than"),
    ({"temperature": 1.5}, "temperature"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
])
def test_invalid_requests(server: ServerHarness, body: dict[str, Any], needle: str) -> None:
    full = {"model": "claude-x", "max_tokens": 200, "messages": ask("unicode"), **body}
    r = httpx.post(f"{server.base_url}/v1/messages", json={k: v for k, v in full.items() if v is not None}, timeout=30)
    assert needle in error_of(r, 400, "invalid_request_error")


def test_interleaved_thinking_allows_a_budget_over_max_tokens(server: ServerHarness) -> None:
    body = {"messages": ask("think"), "thinking": {"type": "enabled", "budget_tokens": 4000}, "max_tokens": 2000}
    error_of(post(server, body), 400, "invalid_request_error")
    r = post(server, body, headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    assert r.status_code == 200


def test_sdk_error_classes(server: ServerHarness) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        call(client(server).messages.create, model="claude-x", max_tokens=0, messages=ask("x"))
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        call(client(server).post, "/v1/messages/nope", body={}, cast_to=object)


def test_auth_and_size_errors(make_scripted: Any) -> None:
    harness = make_scripted(api_key="sekret", max_body_size=4096)
    with pytest.raises(anthropic.AuthenticationError) as err:
        call(client(harness, api_key="wrong").messages.create, model="m", max_tokens=10, messages=ask("unicode"))
    assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    for auth in ({"api_key": "sekret"}, {"api_key": None, "auth_token": "sekret"}):
        ok = call(client(harness, **auth).messages.create, model="m", max_tokens=100, messages=ask("unicode"))
        assert ok.content[0].text == SCRIPTS["unicode"]
    big = [{"role": "user", "content": "x" * 8000}]
    r = httpx.post(f"{harness.base_url}/v1/messages?beta=true", json={"model": "m", "max_tokens": 5, "messages": big},
                   headers={"x-api-key": "sekret"})
    error_of(r, 413, "request_too_large")
    # The OpenAI routes keep their own shape.
    assert httpx.post(f"{harness.base_url}/v1/responses", json={"input": "x"}).json()["error"]["type"] == "authentication_error"


def test_strict_model_name_is_not_found(make_scripted: Any) -> None:
    harness = make_scripted(strict_model_name=True, served_model_name="edge")
    error_of(post(harness, {"messages": ask("unicode")}), 404, "not_found_error")
    assert post(harness, {"messages": ask("unicode"), "model": "edge"}).status_code == 200


def test_overloaded_is_529_with_retry_after(make_scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = make_scripted()

    def full(adds: Any) -> Any:
        raise Overloaded("the queue is full", retry_after=2.5)

    monkeypatch.setattr(harness.client, "submit", full)
    r = post(harness, {"messages": ask("unicode")})
    assert error_of(r, 529, "overloaded_error") == "the queue is full" and r.headers["retry-after"] == "3"
    with pytest.raises(anthropic.APIStatusError) as err:
        call(client(harness).messages.create, model="m", max_tokens=10, messages=ask("unicode"))
    assert err.value.status_code == 529
    with pytest.raises(openai.RateLimitError) as oerr:
        call(harness.openai().responses.create, model="m", input="hi")
    assert oerr.value.response.headers["retry-after"] == "3"


def test_engine_failure_midway(server: ServerHarness) -> None:
    r = post(server, {"messages": ask("fail")})
    assert "scripted failure" in error_of(r, r.status_code, "api_error") and r.status_code >= 500
    events = raw_events(server, {"messages": ask("fail")})
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "error"
    assert events[-1]["error"]["type"] == "api_error"
    assert 0 < len([e for e in events if e["type"] == "content_block_delta"]) <= FAIL_AFTER
    with pytest.raises(anthropic.APIStatusError), call(client(server).messages.stream, model="m", max_tokens=100,
                                                       messages=ask("fail")) as stream:
        stream.get_final_message()


def test_engine_gone_is_503_in_each_shape(make_scripted: Any) -> None:
    harness = make_scripted()
    with pytest.raises(anthropic.APIStatusError):  # the crash itself: 503 before any byte
        call(client(harness).messages.create, model="m", max_tokens=10, messages=ask("crash"))
    error_of(post(harness, {"messages": ask("unicode")}), 503, "api_error")
    with pytest.raises(anthropic.APIStatusError) as err:
        call(client(harness).messages.count_tokens, model="m", messages=ask("unicode"))
    assert err.value.status_code == 503
    with pytest.raises(openai.InternalServerError) as oerr:
        call(harness.openai().responses.create, model="m", input="hi")
    assert oerr.value.status_code == 503 and oerr.value.body["code"] == "engine_unavailable"  # type: ignore[index]
