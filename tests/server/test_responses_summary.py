"""Reasoning summaries on `POST /v1/responses` (what Codex shows): with `reasoning.summary`
asked for, each reasoning item also carries its thinking as one `summary_text` part, streamed
with OpenAI's summary events; without it nothing changes. Checked against the scripted
engine's own thinking text and the real `openai` SDK's types (strictly)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents_support import call, last_prompt, start_caching_server, strict
from openai.types.responses import (
    Response,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
)
from server_harness import ServerHarness
from test_responses import WEATHER, ask, raw, raw_events

from edgemoe.tokenizer import TokenizerBundle

THOUGHT = "The user wants a number. 6 times 7."  # the "think" script's <think> text
TOOL_THOUGHT = "I should call the weather tool."  # the "tool" script's
SUMMARY_EVENTS = ("response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
                  "response.reasoning_summary_text.done", "response.reasoning_summary_part.done")


@pytest.fixture(scope="module")
def server(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_caching_server(demo_dir, demo_tokenizer)
    yield harness
    harness.stop()


def reasoning_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the (first) reasoning item, from its `output_item.added` to its `output_item.done`."""
    index = next(e["output_index"] for e in events
                 if e["type"] == "response.output_item.added" and e["item"]["type"] == "reasoning")
    return [e for e in events if e.get("output_index") == index]


def test_streamed_summary_events_in_openai_order(server: ServerHarness) -> None:
    events = raw_events(server, {"input": ask("think"), "reasoning": {"effort": "medium", "summary": "auto"}})
    mine = reasoning_events(events)
    item_id = mine[0]["item"]["id"]
    assert mine[0]["type"] == "response.output_item.added" and mine[0]["item"]["summary"] == []
    summary = [e for e in mine if e["type"] in SUMMARY_EVENTS]
    types = [e["type"] for e in summary]
    # part added → text deltas → text done → part done, then straight to the item's done
    assert types[0] == SUMMARY_EVENTS[0] and types[-2:] == list(SUMMARY_EVENTS[2:])
    assert set(types[1:-2]) == {SUMMARY_EVENTS[1]} and len(types) > 4
    assert [e["type"] for e in mine[-2:]] == [SUMMARY_EVENTS[3], "response.output_item.done"]
    assert all(e["item_id"] == item_id and e["summary_index"] == 0 for e in summary)
    assert summary[0]["part"] == {"type": "summary_text", "text": ""}
    assert "".join(e["delta"] for e in summary[1:-2]) == summary[-2]["text"] == THOUGHT
    assert summary[-1]["part"] == {"type": "summary_text", "text": THOUGHT} and "status" not in summary[-1]
    # the content part is still streamed, unchanged
    assert "".join(e["delta"] for e in mine if e["type"] == "response.reasoning_text.delta") == THOUGHT
    done = mine[-1]["item"]
    assert done["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    assert done["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    final = events[-1]["response"]
    assert final["output"][0] == done and final["reasoning"]["summary"] == "auto"


def test_the_sdk_parses_the_summary_stream(server: ServerHarness) -> None:
    client = server.openai()
    with call(client.responses.stream, model="m", input=ask("think"), reasoning={"summary": "detailed"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = (ResponseReasoningSummaryPartAddedEvent, ResponseReasoningSummaryTextDeltaEvent,
             ResponseReasoningSummaryTextDoneEvent, ResponseReasoningSummaryPartDoneEvent)
    typed = [e for e in events if isinstance(e, kinds)]
    assert {type(e) for e in typed} == set(kinds)
    assert "".join(e.delta for e in typed if isinstance(e, ResponseReasoningSummaryTextDeltaEvent)) == THOUGHT
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and [s.text for s in reasoning.summary] == [THOUGHT]
    assert final.output_text == "The answer is 42."


def test_non_streamed_summary(server: ServerHarness) -> None:
    body = raw(server, {"input": ask("think"), "reasoning": {"summary": "concise"},
                        "include": ["reasoning.encrypted_content"]}).json()
    response = strict(Response, body)
    reasoning = response.output[0]
    assert reasoning.type == "reasoning"
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", THOUGHT)]
    assert reasoning.content is not None and reasoning.content[0].text == THOUGHT and reasoning.encrypted_content
    assert response.reasoning is not None and response.reasoning.summary == "concise"
    sdk = call(server.openai().responses.create, model="m", input=ask("think"), reasoning={"summary": "auto"})
    assert [s.text for s in sdk.output[0].summary] == [THOUGHT]  # type: ignore[union-attr]


def test_the_deprecated_generate_summary_asks_too(server: ServerHarness) -> None:
    body = raw(server, {"input": ask("think"), "reasoning": {"generate_summary": "auto"}}).json()
    assert body["output"][0]["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    assert strict(Response, body).reasoning.summary == "auto"


@pytest.mark.parametrize("reasoning", [None, {"effort": "high"}, {"summary": None}, {"summary": "none"}])
def test_no_summary_unless_asked(server: ServerHarness, reasoning: dict[str, Any] | None) -> None:
    extra = {"reasoning": reasoning} if reasoning is not None else {}
    body = raw(server, {"input": ask("think"), **extra}).json()
    response = strict(Response, body)  # "none" is echoed as null: the SDK's type has no "none"
    assert body["output"][0]["summary"] == [] and body["output"][0]["content"][0]["text"] == THOUGHT
    assert response.reasoning is not None and response.reasoning.summary is None
    events = raw_events(server, {"input": ask("think"), **extra})
    assert not [e for e in events if e["type"] in SUMMARY_EVENTS]
    assert all(i["summary"] == [] for i in events[-1]["response"]["output"] if i["type"] == "reasoning")


@pytest.mark.parametrize("reasoning", [{"summary": "verbose"}, {"summary": 3}, {"generate_summary": "always"}])
def test_an_unknown_summary_is_400(server: ServerHarness, reasoning: dict[str, Any]) -> None:
    r = raw(server, {"input": ask("think"), "reasoning": reasoning})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"reasoning.{next(iter(reasoning))}"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_cut_summary_part_is_incomplete(server: ServerHarness) -> None:
    events = raw_events(server, {"input": ask("think"), "max_output_tokens": 4, "reasoning": {"summary": "auto"}})
    part_done = [e for e in events if e["type"] == "response.reasoning_summary_part.done"]
    assert len(part_done) == 1 and part_done[0]["status"] == "incomplete"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("keep", [("summary", "content", "encrypted_content"), ("summary", "encrypted_content"),
                                  ("summary", "content"), ("summary",)])
def test_an_echoed_summary_is_rendered_once(server: ServerHarness, demo_tokenizer: TokenizerBundle,
                                            keep: tuple[str, ...]) -> None:
    """Codex sends the reasoning item back with its summary (and its content and/or
    encrypted_content): the thought reaches the next prompt once, as the model wrote it."""
    client = server.openai()
    first = call(client.responses.create, model="m", input=ask("tool"), tools=[WEATHER],
                 include=["reasoning.encrypted_content"], reasoning={"effort": "medium", "summary": "auto"})
    reasoning, fc = first.output
    assert reasoning.type == "reasoning" and [s.text for s in reasoning.summary] == [TOOL_THOUGHT]
    sent = reasoning.model_dump(exclude_none=True)
    item = {"type": "reasoning", "id": reasoning.id, **{k: sent[k] for k in keep}}
    history = [*ask("tool"), item, fc.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny [[answer]]"}]
    call(client.responses.create, model="m", input=history, tools=[WEATHER], reasoning={"summary": "auto"})
    prompt = last_prompt(server, demo_tokenizer)
    assert prompt.count(TOOL_THOUGHT) == 1
    assert f"<think>\n{TOOL_THOUGHT}\n</think>\n\n<tool_call>" in prompt
