"""`POST /v1/responses` through the real `openai` SDK (and raw HTTP for the exact wire shape),
against the real app over the scripted engine: text, streams, tool turns, thinking,
usage (cached tokens), errors. Every payload is validated strictly against the SDK types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from openai.types.responses import Response, ResponseStreamEvent
from server_harness import ServerHarness
from server_scripts import SCRIPTS

from edgemoe.tokenizer import TokenizerBundle

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast for a city",
           "parameters": WEATHER_SCHEMA, "strict": False}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
# What Codex sends besides function tools: skipped, never refused.
OTHER_TOOLS: list[dict[str, Any]] = [
    {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "text"}},
    {"type": "local_shell"}, {"type": "web_search"}, {"type": "image_generation"},
]


@pytest.fixture(scope="module")
def server(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_caching_server(demo_dir, demo_tokenizer)
    yield harness
    harness.stop()


def ask(script: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Go. [[{script}]]"}]}]


def raw(server: ServerHarness, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/responses", json={"model": "m", **body}, timeout=30, **kwargs)


def raw_events(server: ServerHarness, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a streamed response, checked against its `event:` line and the SDK type."""
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={"model": "m", "stream": True, **body},
                      timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == name
                events.append(event)
    for event in events:
        error = event.get("response", {}).get("error") or {}
        if error.get("code") != "context_length_exceeded":  # not in the SDK's list: see below
            strict(ResponseStreamEvent, event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_text_non_streamed(server: ServerHarness) -> None:
    body = raw(server, {"input": ask("think"), "instructions": "Be brief."}).json()
    response = strict(Response, body)
    assert response.id.startswith("resp_") and response.status == "completed"
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content[0].text == "The user wants a number. 6 times 7."
    assert message.type == "message" and message.id.startswith("msg_")
    assert response.output_text == "The answer is 42."
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens
    sdk = call(server.openai().responses.create, model="m", input=ask("think"), instructions="Be brief.")
    assert sdk.output_text == "The answer is 42." and sdk.usage is not None


def test_plain_string_input_and_instructions(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    response = call(server.openai().responses.create, model="m", input="Say [[unicode]]", instructions="You are terse.")
    assert response.output_text == SCRIPTS["unicode"]
    prompt = last_prompt(server, demo_tokenizer)
    assert prompt.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay [[unicode]]")


def test_stream_event_sequence(server: ServerHarness) -> None:
    events = raw_events(server, {"input": ask("think")})
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    for kind, delta in (("reasoning", "response.reasoning_text.delta"), ("message", "response.output_text.delta")):
        added = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.added"
                     and e["item"]["type"] == kind)
        index = events[added]["output_index"]
        mine = [e["type"] for e in events if e.get("output_index") == index]
        done = "response.output_text.done" if kind == "message" else "response.reasoning_text.done"
        assert mine[0] == "response.output_item.added" and mine[1] == "response.content_part.added"
        assert set(mine[2:-3]) == {delta}
        assert mine[-3:] == [done, "response.content_part.done", "response.output_item.done"]
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["usage"]["input_tokens"] > 0


def test_stream_matches_non_streamed_through_the_sdk(server: ServerHarness) -> None:
    client = server.openai()
    full = call(client.responses.create, model="m", input=ask("two_tools"), tools=[WEATHER, TIME])
    with call(client.responses.stream, model="m", input=ask("two_tools"), tools=[WEATHER, TIME]) as stream:
        seen = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in seen and seen[-1] == "response.completed"
    created = call(client.responses.create, model="m", input=ask("two_tools"), tools=[WEATHER, TIME], stream=True)
    last = [event for event in created][-1]
    assert last.type == "response.completed"
    for response in (full, streamed, last.response):
        assert response.output_text == "Checking both."
        calls = [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]
        assert calls == [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "Europe/Paris"})]


def test_tool_call_turns(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    """call → result → answer, with the history as Codex resends it (reasoning items included)."""
    client = server.openai()
    tools: list[Any] = [WEATHER, *OTHER_TOOLS]
    first = call(client.responses.create, model="m", input=ask("tool"), tools=tools, store=False,
                 include=["reasoning.encrypted_content"], prompt_cache_key="session-1", parallel_tool_calls=False,
                 reasoning={"effort": "medium", "summary": "auto"}, text={"verbosity": "low"})
    reasoning, fc = first.output
    assert fc.type == "function_call" and fc.id.startswith("fc_") and fc.call_id.startswith("call_")
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris", "days": 3}
    assert "apply_patch" not in last_prompt(server, demo_tokenizer)
    history = [*ask("tool"), reasoning.model_dump(exclude_none=True), fc.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21C [[answer]]"}]
    with call(client.responses.stream, model="m", input=history, tools=tools) as stream:
        second = stream.get_final_response()
    assert second.output_text == ANSWER
    prompt = last_prompt(server, demo_tokenizer)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21C [[answer]]\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_usage_reports_cached_tokens(server: ServerHarness) -> None:
    client = server.openai()
    history = [{"role": "user", "content": "A long shared preamble. " * 20 + " [[unicode]]"}]
    call(client.responses.create, model="m", input=history)
    again = call(client.responses.create, model="m", input=[*history, {"role": "assistant", "content": "ok"},
                                                            {"role": "user", "content": "more"}])
    engine_cached = server.engine.last_cached()  # type: ignore[attr-defined]
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens == engine_cached > 100


@pytest.fixture(scope="module")
def thinking_off(make_scripted: Any) -> ServerHarness:
    return make_scripted(default_thinking_mode="off")


@pytest.mark.parametrize(("effort", "default", "thinking"), [
    (None, "on", True), ("none", "on", False), ("minimal", "on", False), ("high", "off", True), (None, "off", False),
])
def test_reasoning_effort_wins_over_the_default(server: ServerHarness, thinking_off: ServerHarness,
                                                demo_tokenizer: TokenizerBundle,
                                                effort: str | None, default: str, thinking: bool) -> None:
    harness = server if default == "on" else thinking_off
    extra = {"reasoning": {"effort": effort}} if effort else {}
    response = call(harness.openai().responses.create, model="m", input=ask("think"), **extra)
    prompt = last_prompt(harness, demo_tokenizer)
    assert prompt.endswith("<think>\n\n</think>\n\n") != thinking
    assert response.output_text == ("The answer is 42." if thinking else SCRIPTS["think"])
    assert any(i.type == "reasoning" for i in response.output) == thinking


def test_max_output_tokens_is_incomplete(server: ServerHarness) -> None:
    body = raw(server, {"input": ask("think"), "max_output_tokens": 4}).json()
    response = strict(Response, body)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4
    assert response.output[-1].status == "incomplete"  # the item the limit cut, as OpenAI marks it
    events = raw_events(server, {"input": ask("think"), "max_output_tokens": 4})
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["output"][-1]["status"] == "incomplete"
    assert all(e["item"]["status"] == "incomplete" for e in events if e["type"] == "response.output_item.done")


def test_an_answer_that_ends_is_completed_item_by_item(server: ServerHarness) -> None:
    body = raw(server, {"input": ask("think")}).json()
    assert body["status"] == "completed" and all(item["status"] == "completed" for item in body["output"])


# --------------------------------------------------------------------------- errors


def test_validation_errors_are_400(server: ServerHarness) -> None:
    client = server.openai()
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "input"),
        ({"input": [{"type": "message", "role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input[0].content[0].text"),
    ]
    for body, param in cases:
        r = raw(server, body)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param, r.json()
    with pytest.raises(openai.BadRequestError):
        call(client.responses.create, model="m", input="hi", previous_response_id="resp_1")


def test_context_length_exceeded(server: ServerHarness) -> None:
    long = "word " * 5000  # past the scripted engine's 4096-token context
    r = raw(server, {"input": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    events = raw_events(server, {"input": long})
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
    # The SDK's type lists codes of OpenAI's own; everything else about the event is exact.
    strict(ResponseStreamEvent, {**events[-1], "response": {**failed, "error": {**failed["error"], "code": "server_error"}}})
    stream = call(server.openai().responses.create, model="m", input=long, stream=True)
    assert [e.type for e in stream][-1] == "response.failed"


def test_engine_failure_midway(server: ServerHarness) -> None:
    r = raw(server, {"input": ask("fail")})
    assert r.status_code >= 500 and "scripted failure" in r.json()["error"]["message"]
    events = raw_events(server, {"input": ask("fail")})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    deltas = [e for e in events if e["type"].endswith(".delta")]
    assert 0 < len(deltas) <= FAIL_AFTER


def test_api_key(make_scripted: Any) -> None:
    harness = make_scripted(api_key="sekret")
    with pytest.raises(openai.AuthenticationError):
        call(harness.openai(api_key="wrong").responses.create, model="m", input="hi [[unicode]]")
    ok = call(harness.openai(api_key="sekret").responses.create, model="m", input="hi [[unicode]]")
    assert ok.output_text == SCRIPTS["unicode"]


# --------------------------------------------------------------------------- include, logprobs, limits


@pytest.mark.parametrize(("extra", "param"), [
    ({"top_logprobs": 99}, "top_logprobs"), ({"top_logprobs": -1}, "top_logprobs"),
    ({"max_tool_calls": -1}, "max_tool_calls"), ({"max_tool_calls": "3"}, "max_tool_calls"),
    ({"include": "x"}, "include"), ({"include": ["reasoning.encrypted_content", "x"]}, "include[1]"),
    ({"text": {"verbosity": 5}}, "text.verbosity"), ({"text": {"verbosity": "loud"}}, "text.verbosity"),
])
def test_option_values_outside_the_api_are_400(server: ServerHarness, extra: dict[str, Any], param: str) -> None:
    r = raw(server, {"input": "hi [[unicode]]", **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_logprobs_are_honoured(server: ServerHarness) -> None:
    client = server.openai()
    response = call(client.responses.create, model="m", input=ask("think"), top_logprobs=2,
                    include=["message.output_text.logprobs"])
    message = response.output[-1]
    assert message.type == "message" and response.top_logprobs == 2
    logprobs = message.content[0].logprobs  # type: ignore[union-attr]
    assert logprobs and all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in logprobs)
    # Streamed: the deltas carry them, and add up to the done part's.
    events = raw_events(server, {"input": ask("think"), "include": ["message.output_text.logprobs"]})
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    done = next(e for e in events if e["type"] == "response.content_part.done" and e["part"]["type"] == "output_text")
    assert streamed and streamed == done["part"]["logprobs"] and all(lp["top_logprobs"] == [] for lp in streamed)
    plain = raw(server, {"input": ask("think")}).json()
    assert "logprobs" not in plain["output"][-1]["content"][0]
    # As the real API: top_logprobs without the include sizes nothing (the SDK sees no logprobs).
    sized = call(client.responses.create, model="m", input=ask("think"), top_logprobs=2)
    assert not sized.output[-1].content[0].logprobs  # type: ignore[union-attr]


def test_encrypted_reasoning_round_trips(server: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = server.openai()
    first = call(client.responses.create, model="m", input=ask("tool"), tools=[WEATHER],
                 include=["reasoning.encrypted_content"], max_tool_calls=1)
    reasoning, fc = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content and first.max_tool_calls == 1
    kept = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    history = [*ask("tool"), kept, fc.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny [[answer]]"}]
    call(client.responses.create, model="m", input=history, tools=[WEATHER])
    assert "I should call the weather tool." in last_prompt(server, demo_tokenizer)
    assert not call(client.responses.create, model="m", input=ask("tool"), tools=[WEATHER]).output[0].encrypted_content


def test_valid_options_are_taken(server: ServerHarness) -> None:
    """max_tool_calls caps hosted-tool calls only (the SDK's words): function calls stay."""
    body = raw(server, {"input": ask("two_tools"), "tools": [WEATHER, TIME], "max_tool_calls": 1,
                        "text": {"verbosity": "low"}, "include": ["web_search_call.action.sources"]}).json()
    response = strict(Response, body)
    assert [i.type for i in response.output].count("function_call") == 2
    assert response.max_tool_calls == 1 and response.text is not None and response.text.verbosity == "low"
