"""Regressions found by a randomized conformance campaign against the SDKs' own stream
accumulators (openai `chat.completions.stream` / `responses.stream`, anthropic
`messages.stream`): the streamed and non-streamed answers to one request must agree,
across the protocols, also when max_tokens or a stop string cuts the output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from server_harness import ServerHarness, scripted_server
from server_scripts import TIME_TOOL, WEATHER_TOOL

from edgemoe.server.config import ServerConfig
from edgemoe.tokenizer import TokenizerBundle

QWEN_WEATHER = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
SCRIPTS = {
    "two": "Checking both.\n" + QWEN_WEATHER,
    # The model itself ends (EOS) inside the second parameter: its raw text is content.
    "eos_in_call": "Checking both.\n" + QWEN_WEATHER[: QWEN_WEATHER.index("<parameter=days>") + 18],
    "reason": "<think>\nThe user wants weather. Paris it is.\n</think>\n\nThe answer is 42.",
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
# Tokens of "two" up to and including "<parameter=days": max_tokens=24 cuts inside that
# parameter, after "city" was complete (the call was announced, with {"city": "Paris").
CUT_IN_CALL = 24


@pytest.fixture(scope="module")
def qwen(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = scripted_server(demo_tokenizer, SCRIPTS, demo_dir, config=ServerConfig(tool_call_parser="qwen3_coder"))
    yield harness
    harness.stop()


def _anthropic(h: ServerHarness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=h.base_url, api_key="x", max_retries=0, timeout=60)


def _message_request(script: str = "two", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"[[{script}]]"}], "tools": ANTHROPIC_TOOLS,
            **extra}


@pytest.mark.parametrize(("script", "limit", "blocks", "stop_reason"), [
    ("eos_in_call", 200, ["text", "tool_use", "text"], "tool_use"),
    ("two", CUT_IN_CALL, ["text", "tool_use"], "max_tokens")])
def test_cut_call_arguments_reach_tool_use_block(qwen: ServerHarness, script: str, limit: int, blocks: list[str],
                                                 stop_reason: str) -> None:
    """The end of a call and the text after it arrive in one parser flush (EOS inside the
    call: its raw tail is content); the call's closing "}" used to be sent after the text
    block opened, so Anthropic dropped it: input {} non-streamed, and input_json deltas that
    were not JSON when streamed. Cut by max_tokens instead, the raw tail is no text at all."""
    client = _anthropic(qwen)
    full = client.messages.create(**_message_request(script, max_tokens=limit))
    with client.messages.stream(**_message_request(script, max_tokens=limit)) as stream:
        parts = [e.delta.partial_json for e in stream
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        streamed = stream.get_final_message()
    assert json.loads("".join(parts)) == {"city": "Paris"}
    for message in (full, streamed):
        assert [b.type for b in message.content] == blocks
        assert message.content[1].input == {"city": "Paris"}
        assert message.stop_reason == stop_reason


def test_cut_call_arguments_reach_function_call_item(qwen: ServerHarness) -> None:
    client = qwen.openai()
    request = {"model": "m", "input": "[[two]]", "max_output_tokens": CUT_IN_CALL,
               "tools": [{"type": "function", **t["function"]} for t in TOOLS]}
    full = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        events = list(stream)
    # The SDK's get_final_response() only knows response.completed; a cut response
    # ends with response.incomplete, as OpenAI's does.
    assert events[-1].type == "response.incomplete"
    streamed = events[-1].response
    for response in (full, streamed):
        calls = [i for i in response.output if i.type == "function_call"]
        assert [c.arguments for c in calls] == ['{"city": "Paris"}']
        assert response.status == "incomplete"
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done == ['{"city": "Paris"}']


def test_max_tokens_mid_call_says_length(qwen: ServerHarness) -> None:
    """A call was announced, then max_tokens cut the output: that is "length", not
    "tool_calls" (the call or the text after it may be truncated)."""
    client = qwen.openai()
    request = {"model": "m", "messages": [{"role": "user", "content": "[[two]]"}], "tools": TOOLS,
               "max_tokens": CUT_IN_CALL, "stream_options": {"include_usage": True}}
    full = client.chat.completions.create(**request)
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        with pytest.raises(openai.LengthFinishReasonError):  # the SDK's own rule for length
            stream.get_final_completion()
        streamed = stream.current_completion_snapshot
    for completion in (full, streamed):
        choice = completion.choices[0]
        assert choice.finish_reason == "length"
        assert [t.function.arguments for t in choice.message.tool_calls or []] == ['{"city": "Paris"}']
    assert streamed.usage is not None and streamed.usage.completion_tokens == CUT_IN_CALL == full.usage.completion_tokens


def test_completions_stream_text_offset_matches_non_streamed(qwen: ServerHarness) -> None:
    """A possible stop string ("\\n\\n" after ".\\n") holds text back; the streamed
    text_offset used to count the text sent instead of the tokens' text."""
    client = qwen.openai()
    request = {"model": "m", "prompt": "[[reason]]", "max_tokens": 40, "logprobs": 1, "stop": ["\n\n"]}
    full = client.completions.create(**request)
    offsets: list[int] = []
    text = ""
    for chunk in client.completions.create(stream=True, **request):
        for c in chunk.choices:
            text += c.text
            offsets += (c.logprobs.text_offset or []) if c.logprobs else []
    assert full.choices[0].logprobs is not None
    assert text == full.choices[0].text
    assert offsets == full.choices[0].logprobs.text_offset
