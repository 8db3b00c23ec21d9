"""Tool calls and reasoning through the real parsers (scripted model output), via the openai SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from server_harness import MakeServer, ServerHarness
from server_scripts import SCRIPTS, TIME_TOOL, WEATHER_TOOL

from edgemoe.tokenizer import TokenizerBundle

TOOLS = [WEATHER_TOOL, TIME_TOOL]


def ask(script: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Go. [[{script}]]"}]


def test_tool_call_non_streamed(scripted: ServerHarness) -> None:
    full = scripted.openai().chat.completions.create(model="m", messages=ask("tool"), tools=TOOLS)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    extra = choice.message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == "I should call the weather tool."
    assert full.usage is not None and 0 < full.usage.completion_tokens_details.reasoning_tokens < full.usage.completion_tokens


def test_tool_calls_streamed_match_non_streamed(scripted: ServerHarness) -> None:
    client = scripted.openai()
    full = client.chat.completions.create(model="m", messages=ask("two_tools"), tools=TOOLS)
    with client.chat.completions.stream(model="m", messages=ask("two_tools"), tools=TOOLS) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    for a, b in [(full.choices[0], streamed.choices[0])]:
        assert a.finish_reason == b.finish_reason == "tool_calls"
        assert a.message.content == b.message.content == "Checking both."
        assert [(c.function.name, json.loads(c.function.arguments)) for c in a.message.tool_calls or []] == [
            (c.function.name, json.loads(c.function.arguments)) for c in b.message.tool_calls or []
        ] == [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "Europe/Paris"})]


def test_tool_call_deltas_carry_index(scripted: ServerHarness) -> None:
    body = {"model": "m", "messages": ask("two_tools"), "tools": TOOLS, "stream": True}
    with httpx.stream("POST", f"{scripted.base_url}/v1/chat/completions", json=body, timeout=30) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk, strict=True)
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert all("index" in d for d in deltas)
    firsts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]["name"], d["function"]["arguments"], d["type"]) for d in firsts] == [
        (0, "get_weather", "", "function"), (1, "get_time", "", "function")]
    for index, expected in [(0, {"city": "Paris", "days": 3}), (1, {"zone": "Europe/Paris"})]:
        args = "".join(d["function"]["arguments"] for d in deltas if d["index"] == index)
        assert json.loads(args) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_tool_calls_false_keeps_the_first(scripted: ServerHarness) -> None:
    client = scripted.openai()
    full = client.chat.completions.create(model="m", messages=ask("two_tools"), tools=TOOLS,
                                          parallel_tool_calls=False)
    assert [c.function.name for c in full.choices[0].message.tool_calls or []] == ["get_weather"]
    streamed = [d for c in client.chat.completions.create(model="m", messages=ask("two_tools"), tools=TOOLS,
                                                          parallel_tool_calls=False, stream=True)
                if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert {d.index for d in streamed} == {0}


def test_tool_choice_none_hides_tools(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    full = scripted.openai().chat.completions.create(model="m", messages=ask("two_tools"), tools=TOOLS,
                                                     tool_choice="none")
    prompt_ids, _ = scripted.engine.seen[-1]
    assert "get_weather" not in demo_tokenizer.decode(prompt_ids)
    assert full.choices[0].finish_reason == "stop" and not full.choices[0].message.tool_calls
    assert "<tool_call>" in (full.choices[0].message.content or "")


def test_named_and_required_tool_choice(scripted: ServerHarness) -> None:
    # A forced call: the prompt opens it, the script is the rest (test_forced_tool_calls.py).
    client = scripted.openai()
    for choice, script in (({"type": "function", "function": {"name": "get_weather"}}, "forced_named"),
                           ("required", "forced_any")):
        for stream in (False, True):
            if stream:
                finish = [c.choices[0].finish_reason for c in client.chat.completions.create(
                    model="m", messages=ask(script), tools=TOOLS, tool_choice=choice, stream=True) if c.choices]
                assert finish[-1] == "tool_calls"
            else:
                full = client.chat.completions.create(model="m", messages=ask(script), tools=TOOLS,
                                                      tool_choice=choice)
                assert full.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ask("tool"), tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice"


def test_reasoning_streamed(scripted: ServerHarness) -> None:
    body = {"model": "m", "messages": ask("think"), "stream": True}
    with httpx.stream("POST", f"{scripted.base_url}/v1/chat/completions", json=body, timeout=30) as r:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines() if line.startswith("data: {")]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == "".join(d.get("reasoning", "") for d in deltas) == "The user wants a number. 6 times 7."
    assert "".join(d.get("content") or "" for d in deltas) == "The answer is 42."


@pytest.mark.parametrize(
    ("extra", "thinking"),
    [
        ({}, True),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "minimal"}, False),
        ({"reasoning_effort": "high"}, True),
        ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}, False),
    ],
)
def test_thinking_switch(scripted: ServerHarness, demo_tokenizer: TokenizerBundle,
                         extra: dict[str, Any], thinking: bool) -> None:
    data = httpx.post(f"{scripted.base_url}/v1/chat/completions",
                      json={"model": "m", "messages": ask("think"), **extra}, timeout=30).json()
    prompt = demo_tokenizer.decode(scripted.engine.seen[-1][0])
    message = data["choices"][0]["message"]
    if thinking:
        assert not prompt.endswith("</think>\n\n")
        assert message["reasoning_content"] and message["content"] == "The answer is 42."
    else:  # the template closed an empty think block; the output is all content
        assert prompt.endswith("<think>\n\n</think>\n\n")
        assert "reasoning_content" not in message and message["content"] == SCRIPTS["think"]


def test_default_thinking_mode_off(make_scripted: MakeServer) -> None:
    h = make_scripted(default_thinking_mode="off")
    client = h.openai()
    off = client.chat.completions.create(model="m", messages=ask("think"))
    assert off.choices[0].message.content == SCRIPTS["think"]
    on = client.chat.completions.create(model="m", messages=ask("think"), reasoning_effort="low")
    assert on.choices[0].message.content == "The answer is 42."
