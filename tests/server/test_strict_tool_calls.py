"""Tool calls held to their tools' schemas through the whole server (real engine, demo
model, CPU): strict tools (OpenAI's `strict`, Anthropic's) and `tool_choice` "required"
make every call the random model writes valid — checked by the SDKs' own parsing
(`openai.pydantic_function_tool` + `chat.completions.parse` validates each call's
arguments into the pydantic model) and by `jsonschema_rs`. A strict tool whose schema
can't be enforced is a 400 naming the tool."""

from __future__ import annotations

import json
from typing import Any, Literal

import anthropic
import jsonschema_rs
import openai
import pytest
from pydantic import BaseModel, Field
from server_harness import ServerHarness

USER = [{"role": "user", "content": "Turn on a light."}]
OPEN_CALL = 151657  # <tool_call> in the demo model's (Qwen3's) vocabulary


class SetLight(BaseModel):
    on: bool
    room: Literal["hall", "kitchen"]
    level: int = Field(ge=0)
    tags: list[Literal["warm", "cold"]] = Field(max_length=2)


NOTE = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 8}}, "required": ["text"],
        "additionalProperties": False}
UNENFORCEABLE = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}


@pytest.fixture(scope="module")
def real(real_fp32: ServerHarness) -> ServerHarness:
    return real_fp32


def function(name: str, parameters: dict[str, Any], strict: bool | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"name": name, "parameters": parameters}
    if strict is not None:
        f["strict"] = strict
    return {"type": "function", "function": f}


@pytest.mark.parametrize("choice, bias", [("required", None), ("auto", {str(OPEN_CALL): 30})])
def test_parse_helper_reads_every_strict_call(real: ServerHarness, choice: str, bias: dict | None) -> None:
    """`auto`: logit_bias makes the random model open a call; the mask does the rest."""
    out = real.openai().chat.completions.parse(
        model="m", messages=USER, tools=[openai.pydantic_function_tool(SetLight), function("note", NOTE, True)],
        tool_choice=choice, parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=5,
        reasoning_effort="none", **({"logit_bias": bias} if bias else {}))
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0].function
    parsed = call.parsed_arguments
    assert isinstance(parsed, SetLight) if call.name == "SetLight" else parsed == json.loads(call.arguments)
    if call.name == "note":
        assert jsonschema_rs.validator_for(NOTE).is_valid(parsed)


@pytest.mark.parametrize("seed", range(3))
def test_required_calls_are_valid_without_strict(real: ServerHarness, seed: int) -> None:
    tools = [function("set_light", SetLight.model_json_schema()), function("note", NOTE)]
    out = real.openai().chat.completions.create(model="m", messages=USER, tools=tools, tool_choice="required",
                                                max_tokens=300, temperature=1.0, seed=seed, reasoning_effort="none")
    calls = out.choices[0].message.tool_calls
    assert calls
    schemas = {"set_light": SetLight.model_json_schema(), "note": NOTE}
    for c in calls:
        assert jsonschema_rs.validator_for(schemas[c.function.name]).is_valid(json.loads(c.function.arguments))


def test_streamed_strict_call_is_valid(real: ServerHarness) -> None:
    stream = real.openai().chat.completions.create(
        model="m", messages=USER, tools=[function("note", NOTE, True)], tool_choice="required", stream=True,
        parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=9, reasoning_effort="none")
    arguments = "".join(tc.function.arguments or "" for chunk in stream if chunk.choices
                        for tc in chunk.choices[0].delta.tool_calls or [] if tc.function)
    assert jsonschema_rs.validator_for(NOTE).is_valid(json.loads(arguments))


def test_responses_strict_function(real: ServerHarness) -> None:
    out = real.openai().responses.create(
        model="m", input="Take a note.", tool_choice="required", max_output_tokens=200, temperature=1.0,
        reasoning={"effort": "none"}, tools=[{"type": "function", "name": "note", "parameters": NOTE, "strict": True}])
    calls = [o for o in out.output if o.type == "function_call"]
    assert calls and jsonschema_rs.validator_for(NOTE).is_valid(json.loads(calls[0].arguments))


def test_anthropic_strict_tool(real: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=real.base_url, api_key="unused", max_retries=0, timeout=60)
    out = client.messages.create(model="m", max_tokens=200, messages=USER, thinking={"type": "disabled"},
                                 tools=[{"name": "note", "input_schema": NOTE, "strict": True}],
                                 tool_choice={"type": "any"})
    uses = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and uses and jsonschema_rs.validator_for(NOTE).is_valid(uses[0].input)


def test_a_strict_tool_that_cannot_be_enforced_is_a_400(real: ServerHarness) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        real.openai().chat.completions.create(model="m", messages=USER, max_tokens=5,
                                              tools=[function("odd", UNENFORCEABLE, True)])
    assert info.value.status_code == 400 and "'odd'" in str(info.value) and "properties.a" in str(info.value)
    client = anthropic.Anthropic(base_url=real.base_url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError, match="'odd'"):
        client.messages.create(model="m", max_tokens=5, messages=USER,
                               tools=[{"name": "odd", "input_schema": UNENFORCEABLE, "strict": True}])


def test_a_non_strict_tool_that_cannot_be_enforced_still_serves(real: ServerHarness) -> None:
    out = real.openai().chat.completions.create(model="m", messages=USER, max_tokens=40, tool_choice="required",
                                                tools=[function("odd", UNENFORCEABLE), function("note", NOTE)])
    assert out.choices[0].finish_reason in ("tool_calls", "stop", "length")


def test_a_named_strict_tool_that_cannot_be_enforced_is_a_400(real: ServerHarness) -> None:
    with pytest.raises(openai.BadRequestError, match="'odd'"):
        real.openai().chat.completions.create(model="m", messages=USER, max_tokens=5,
                                              tools=[function("odd", UNENFORCEABLE, True)],
                                              tool_choice={"type": "function", "function": {"name": "odd"}})


def test_min_tokens_does_not_force_more_calls(real: ServerHarness) -> None:
    """min_tokens bans EOS: after the call only EOS is allowed, never a second call."""
    out = real.openai().chat.completions.create(
        model="m", messages=USER, tools=[function("note", NOTE, True)], tool_choice="required", max_tokens=200,
        temperature=1.0, seed=3, reasoning_effort="none", extra_body={"min_tokens": 120})
    calls = out.choices[0].message.tool_calls
    assert calls and len(calls) == 1 and out.choices[0].finish_reason == "tool_calls"


def test_anthropic_streamed_strict_tool(real: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=real.base_url, api_key="unused", max_retries=0, timeout=60)
    with client.messages.stream(model="m", max_tokens=200, messages=USER, thinking={"type": "disabled"},
                                tools=[{"name": "note", "input_schema": NOTE, "strict": True}],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1
    assert jsonschema_rs.validator_for(NOTE).is_valid(uses[0].input)


def test_responses_streamed_required_call(real: ServerHarness) -> None:
    stream = real.openai().responses.create(
        model="m", input="Take a note.", tool_choice="required", max_output_tokens=200, temperature=1.0, stream=True,
        reasoning={"effort": "none"}, tools=[{"type": "function", "name": "note", "parameters": NOTE, "strict": False}])
    done = [e for e in stream if e.type == "response.function_call_arguments.done"]
    assert done and jsonschema_rs.validator_for(NOTE).is_valid(json.loads(done[0].arguments))


class Answer(BaseModel):
    done: bool
    room: Literal["hall", "kitchen"]


@pytest.mark.parametrize("bias", [None, {str(OPEN_CALL): 30}])
def test_a_response_format_beside_tools_allows_calls(real: ServerHarness, bias: dict | None) -> None:
    """OpenAI's Agents SDK sends text.format and tools together: the turn is the JSON, or
    tool calls (each valid for its tool) — here the random model is pushed to call."""
    out = real.openai().chat.completions.parse(
        model="m", messages=USER, tools=[function("note", NOTE, True)], response_format=Answer, max_tokens=300,
        temperature=1.0, seed=7, reasoning_effort="none", parallel_tool_calls=False,
        **({"logit_bias": bias} if bias else {}))
    message = out.choices[0].message
    if bias:
        assert out.choices[0].finish_reason == "tool_calls" and message.tool_calls and not message.content
        assert jsonschema_rs.validator_for(NOTE).is_valid(json.loads(message.tool_calls[0].function.arguments))
    else:
        assert out.choices[0].finish_reason == "stop" and isinstance(message.parsed, Answer) and not message.tool_calls
