"""A length limit that cuts the output inside a tool call, end to end through the SDKs.

The call comes back closed with its completed arguments only, the finish reason says it
was cut (`length` / `max_tokens` / `incomplete`), and the call's unfinished raw tail is no
content; streamed and non-streamed agree. EOS inside a call keeps the raw-content rule.
The scripted engine plays the scripts below through the real detokenizer, stop logic and
parsers; `max_tokens` is chosen so the cut lands where each test says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from agents_support import call, strict
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from server_harness import ServerHarness, scripted_server
from server_scripts import TIME_TOOL, WEATHER_TOOL, ask

from edgemoe.messages import RequestOutput
from edgemoe.server.choice import ChoiceState
from edgemoe.server.config import ServerConfig
from edgemoe.server.events import ChoiceDone, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from edgemoe.server.parsers import ResponseParser, get_tool_parser
from edgemoe.tokenizer import TokenizerBundle

TOOLS = [WEATHER_TOOL, TIME_TOOL]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=city>\n"
            "Paris, the city of light and of long rainy afternoons\n</parameter>\n</function>\n</tool_call>")
XML_REST = XML_CALL[len("<tool_call>\n<function=get_weather>\n"):]  # after a named forced opening
SCRIPTS = {
    "cut": "Checking.\n" + XML_CALL,
    "forced_cut": XML_REST,
    "forced_any_cut": "=get_weather>\n" + XML_REST,
    # EOS inside the value: the model ended there, so the raw tail is content (today's rule).
    "eos": "Checking.\n" + XML_CALL[: XML_CALL.index("Paris") + 3],
}
IN_VALUE = "<parameter=city>\nParis, the"  # the cut lands in the value after this
DAYS = {"days": 3}


@pytest.fixture(scope="module")
def qwen(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = scripted_server(demo_tokenizer, SCRIPTS, demo_dir, config=ServerConfig(tool_call_parser="qwen3_coder"))
    yield harness
    harness.stop()


def cut_at(tokenizer: TokenizerBundle, script: str, marker: str) -> int:
    """The fewest tokens of `script` whose text holds `marker`: a max_tokens that cuts there."""
    ids = tokenizer.encode(SCRIPTS[script], add_special_tokens=False)
    return next(n for n in range(1, len(ids)) if marker in tokenizer.decode(ids[:n]))


def _anthropic(harness: ServerHarness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=harness.base_url, api_key="x", max_retries=0, timeout=60)


def _calls(completion: ChatCompletion) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in completion.choices[0].message.tool_calls or []]


def chat_three_ways(harness: ServerHarness, **request: Any) -> tuple[list[ChatCompletion], list[str]]:
    """The non-streamed completion, the SDK's streamed snapshot and the raw body (strictly
    typed), and the argument deltas the stream sent."""
    client = harness.openai()
    request = {"model": "m", "tools": TOOLS, **request}
    full = call(client.chat.completions.create, **request)
    with client.chat.completions.stream(**request, stream_options={"include_usage": True}) as stream:
        deltas = [e.arguments_delta for e in stream if e.type == "tool_calls.function.arguments.delta"]
        try:
            streamed = stream.get_final_completion()
        except openai.LengthFinishReasonError:  # the SDK's own rule for "length"
            streamed = stream.current_completion_snapshot
    raw = httpx.post(f"{harness.base_url}/v1/chat/completions", json=request, timeout=30).json()
    return [full, streamed, strict(ChatCompletion, raw)], deltas


def messages_both(harness: ServerHarness, **request: Any) -> tuple[list[Message], list[str]]:
    sdk = _anthropic(harness)
    request = {"model": "claude-x", "tools": ANTHROPIC_TOOLS, **request}
    full = call(sdk.messages.create, **request)
    with sdk.messages.stream(**request) as stream:
        parts = [e.delta.partial_json for e in stream
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        streamed = stream.get_final_message()
    raw = strict(Message, httpx.post(f"{harness.base_url}/v1/messages", json=request, timeout=30).json())
    return [full, streamed, raw], parts


# --------------------------------------------------------------------------- Chat Completions


def test_chat_cut_in_a_value(qwen: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    limit = cut_at(demo_tokenizer, "cut", IN_VALUE)
    completions, deltas = chat_three_ways(qwen, messages=ask("cut"), max_tokens=limit)
    for completion in completions:
        choice = completion.choices[0]
        assert choice.finish_reason == "length"
        assert choice.message.content == "Checking."  # no "<parameter=city>\nParis, the"
        assert _calls(completion) == [("get_weather", DAYS)]
        assert completion.usage is not None and completion.usage.completion_tokens == limit
    assert "".join(deltas) == '{"days": 3}'  # what was streamed is the final arguments


def test_chat_eos_in_a_call_keeps_the_raw_text(qwen: ServerHarness) -> None:
    completions, _ = chat_three_ways(qwen, messages=ask("eos"))
    for completion in completions:
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Checking.<parameter=city>\nPar"
        assert _calls(completion) == [("get_weather", DAYS)]


@pytest.mark.parametrize(("choice", "script", "calls"), [
    ({"type": "function", "function": {"name": "get_weather"}}, "forced_cut", [("get_weather", DAYS)]),
    ("required", "forced_any_cut", [])])
def test_chat_forced_call_cut(qwen: ServerHarness, demo_tokenizer: TokenizerBundle, choice: Any, script: str,
                              calls: list[Any]) -> None:
    """Named: the opening announced the call, which closes with what it completed. Required,
    cut before the name was read back: nothing of the call (no opening as content)."""
    limit = cut_at(demo_tokenizer, script, IN_VALUE) if calls else 1
    completions, _ = chat_three_ways(qwen, messages=ask(script), tool_choice=choice, max_tokens=limit)
    for completion in completions:
        assert completion.choices[0].finish_reason == "length"
        assert not completion.choices[0].message.content
        assert _calls(completion) == calls


def test_chat_raw_stream_ends_with_length(qwen: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    body = {"model": "m", "messages": ask("cut"), "tools": TOOLS, "stream": True,
            "max_tokens": cut_at(demo_tokenizer, "cut", IN_VALUE)}
    with httpx.stream("POST", f"{qwen.base_url}/v1/chat/completions", json=body, timeout=30) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    args = "".join(t["function"].get("arguments", "") for d in deltas for t in d.get("tool_calls") or [])
    assert json.loads(args) == DAYS
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


# --------------------------------------------------------------------------- Anthropic Messages


def test_messages_cut_in_a_value(qwen: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    limit = cut_at(demo_tokenizer, "cut", IN_VALUE)
    messages, parts = messages_both(qwen, max_tokens=limit, messages=ask("cut"))
    assert json.loads("".join(parts)) == DAYS
    for message in messages:
        assert message.stop_reason == "max_tokens"
        assert [b.type for b in message.content] == ["text", "tool_use"]
        assert message.content[0].text == "Checking."  # type: ignore[union-attr]
        assert message.content[1].input == DAYS  # type: ignore[union-attr]
        assert message.usage.output_tokens == limit


def test_messages_eos_in_a_call_keeps_the_raw_text(qwen: ServerHarness) -> None:
    messages, _ = messages_both(qwen, max_tokens=200, messages=ask("eos"))
    for message in messages:
        assert message.stop_reason == "tool_use"
        assert [b.type for b in message.content] == ["text", "tool_use", "text"]
        assert message.content[2].text == "<parameter=city>\nPar"  # type: ignore[union-attr]


@pytest.mark.parametrize(("choice", "script", "blocks"), [
    ({"type": "tool", "name": "get_weather"}, "forced_cut", ["tool_use"]), ({"type": "any"}, "forced_any_cut", [])])
def test_messages_forced_call_cut(qwen: ServerHarness, demo_tokenizer: TokenizerBundle, choice: dict[str, Any],
                                  script: str, blocks: list[str]) -> None:
    limit = cut_at(demo_tokenizer, script, IN_VALUE) if blocks else 1
    messages, _ = messages_both(qwen, max_tokens=limit, messages=ask(script), tool_choice=choice)
    for message in messages:
        assert message.stop_reason == "max_tokens"
        assert [b.type for b in message.content] == blocks
        if blocks:
            assert message.content[0].input == DAYS  # type: ignore[union-attr]


# --------------------------------------------------------------------------- Responses


def test_responses_cut_in_a_value(qwen: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = qwen.openai()
    request = {"model": "m", "input": ask("cut")[0]["content"],
               "max_output_tokens": cut_at(demo_tokenizer, "cut", IN_VALUE),
               "tools": [{"type": "function", **t["function"]} for t in TOOLS]}
    full = call(client.responses.create, **request)
    with client.responses.stream(**request) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete"
    raw = strict(Response, httpx.post(f"{qwen.base_url}/v1/responses", json=request, timeout=30).json())
    for response in (full, events[-1].response, raw):
        assert response.status == "incomplete" and response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert [(i.type, i.status) for i in response.output] == [("message", "completed"),
                                                                 ("function_call", "incomplete")]
        assert response.output_text == "Checking."
        assert json.loads(response.output[1].arguments) == DAYS  # type: ignore[union-attr]
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in done] == [DAYS]


# --------------------------------------------------------------------------- the seam


def _choice_events(finish_reason: str) -> list[Any]:
    """A choice fed a qwen3_coder call in pieces, ended by `finish_reason` inside a value."""
    choice = ChoiceState(0, ResponseParser(None, get_tool_parser("qwen3_coder")(TOOLS)))
    text = "Ok.\n" + XML_CALL[: XML_CALL.index("Paris") + 5]
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    events: list[Any] = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        events += choice.on_output(RequestOutput(request_id="r", token_ids=[1], text=piece, finished=last,
                                                 finish_reason=finish_reason if last else None))
    return events


@pytest.mark.parametrize(("finish_reason", "content", "done"), [
    ("length", "Ok.", "length"), ("stop", "Ok.<parameter=city>\nParis", "tool_calls")])
def test_the_choice_tells_the_parser_why_the_output_ended(finish_reason: str, content: str, done: str) -> None:
    events = _choice_events(finish_reason)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == content
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["get_weather"]
    assert json.loads("".join(e.arguments for e in events if isinstance(e, ToolCallArgumentsDelta))) == DAYS
    assert isinstance(events[-1], ChoiceDone) and events[-1].finish_reason == done
