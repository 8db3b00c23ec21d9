"""Structured outputs through the whole server (real engine, demo model, CPU), driven by
the SDKs' own structured-output helpers: openai's `chat.completions.parse` and
`responses.parse`, anthropic's `messages.parse` — each builds its schema from a pydantic
model and validates the reply into it, so a reply that is not a valid instance fails the
test. The random model writes whatever the mask leaves it. Bad formats are 400s naming
the client's field and the place in the schema."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any, Literal

import anthropic
import httpx
import jsonschema_rs
import openai
import pytest
from pydantic import BaseModel, Field
from server_harness import ServerHarness

from edgemoe.structured import Grammar

USER = [{"role": "user", "content": "Describe a light."}]


class Light(BaseModel):
    on: bool
    color: Literal["red", "green", "blue"]
    level: int
    tags: list[Literal["warm", "cold"]] = Field(max_length=2)


@pytest.fixture(scope="module")
def real(real_fp32: ServerHarness) -> ServerHarness:
    return real_fp32


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 5}])
def test_chat_parse(real: ServerHarness, sampling: dict[str, Any]) -> None:
    out = real.openai().chat.completions.parse(model="m", messages=USER, response_format=Light, max_tokens=300,
                                                reasoning_effort="none", **sampling)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Light)
    streamed = real.openai().chat.completions.create(
        model="m", messages=USER, max_tokens=300, reasoning_effort="none", stream=True, **sampling,
        response_format={"type": "json_schema", "json_schema": {"name": "light", "schema": Light.model_json_schema()}})
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    Light.model_validate_json(text)


def test_json_object_output_is_an_object_so_far(real: ServerHarness) -> None:
    out = real.openai().chat.completions.create(model="m", messages=USER, max_tokens=30, reasoning_effort="none",
                                                temperature=1.0, seed=3, response_format={"type": "json_object"})
    text = out.choices[0].message.content or ""
    grammar = Grammar.json_object()
    assert text.lstrip().startswith("{") and grammar.advance_bytes(grammar.start(), text.strip().encode())


def test_responses_parse(real: ServerHarness) -> None:
    out = real.openai().responses.parse(model="m", input="Describe a light.", text_format=Light,
                                        max_output_tokens=300, temperature=0.0, reasoning={"effort": "none"})
    assert isinstance(out.output_parsed, Light)


def test_anthropic_parse(real: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=real.base_url, api_key="unused", max_retries=0, timeout=60)
    out = client.messages.parse(model="m", max_tokens=300, messages=USER, output_format=Light,
                                          thinking={"type": "disabled"})
    assert out.stop_reason == "end_turn" and isinstance(out.parsed_output, Light)


def test_thinking_on_then_json(real: ServerHarness) -> None:
    """With thinking on the JSON comes after the think block: whatever the random model
    does inside it, the content is a prefix of a valid instance."""
    out = real.openai().chat.completions.create(
        model="m", messages=USER, max_tokens=60, temperature=1.0, seed=11, reasoning_effort="high",
        response_format={"type": "json_schema", "json_schema": {"name": "light", "schema": Light.model_json_schema()}})
    grammar = Grammar.from_schema(Light.model_json_schema())
    content = (out.choices[0].message.content or "").strip()
    assert grammar.advance_bytes(grammar.start(), content.encode()) is not None, content


@pytest.mark.parametrize("route, body, param", [
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
    ("/v1/chat/completions", {"response_format": "json"}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"not": {}}}}}}},
     "response_format.json_schema.schema.properties.a"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#/$defs/missing"}}}}, "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": [1]}}}, "response_format.json_schema.schema"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "text.format.schema"),
])
def test_bad_formats_are_400s_naming_the_field(real: ServerHarness, route: str, body: dict[str, Any],
                                               param: str) -> None:
    base = {"model": "m", "max_tokens": 5} if route != "/v1/responses" else {"model": "m", "input": "hi"}
    if route == "/v1/chat/completions":
        base["messages"] = USER
    r = httpx.post(f"{real.base_url}{route}", json={**base, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(param), error
    assert "Traceback" not in r.text


def test_anthropic_bad_format_and_prefill(real: ServerHarness) -> None:
    url = f"{real.base_url}/v1/messages"
    base = {"model": "m", "max_tokens": 5, "messages": USER}
    r = httpx.post(url, json={**base, "output_config": {"format": {"type": "text"}}}, timeout=60)
    assert r.status_code == 400 and "output_config.format.type" in r.text
    prefilled = {**base, "messages": USER + [{"role": "assistant", "content": "{"}],
                 "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}
    r = httpx.post(url, json=prefilled, timeout=60)
    assert r.status_code == 400 and "prefilled" in r.text


def test_schema_size_is_bounded(real: ServerHarness) -> None:
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200}
                                             for i in range(2000)}}
    r = httpx.post(f"{real.base_url}/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": USER, "max_tokens": 5,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": huge}}})
    assert r.status_code == 400 and "bytes" in r.json()["error"]["message"]
    assert len(json.dumps(huge)) > 256 * 1024


TOOL_PARAMS = {"type": "object", "properties": {"on": {"type": "boolean"}, "room": {"enum": ["hall", "den"]},
                                                "level": {"type": "integer"}},
               "required": ["on", "room"], "additionalProperties": False}


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 2}])
def test_forced_named_call_arguments_follow_the_tool_schema(real: ServerHarness, sampling: dict[str, Any]) -> None:
    """A forced call to a named tool (Hermes: the prompt ends at `"arguments":`) has its
    arguments constrained to the tool's parameters: the random model writes a valid call."""
    tools = [{"type": "function", "function": {"name": "set_light", "parameters": TOOL_PARAMS}}]
    out = real.openai().chat.completions.create(
        model="m", messages=USER, tools=tools, tool_choice={"type": "function", "function": {"name": "set_light"}},
        max_tokens=200, **sampling)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0].function
    assert call.name == "set_light"
    assert jsonschema_rs.validator_for(TOOL_PARAMS).is_valid(json.loads(call.arguments)), call.arguments


def test_anthropic_forced_tool_input_follows_its_schema(real: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=real.base_url, api_key="unused", max_retries=0, timeout=60)
    out = client.messages.create(model="m", max_tokens=200, messages=USER,
                                 tools=[{"name": "set_light", "input_schema": TOOL_PARAMS}],
                                 tool_choice={"type": "tool", "name": "set_light"})
    uses = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and uses and uses[0].name == "set_light"
    assert jsonschema_rs.validator_for(TOOL_PARAMS).is_valid(uses[0].input), uses[0].input


class Dimmer(BaseModel):
    level: int = Field(ge=1, le=10)
    ratio: float = Field(gt=0, le=1)
    offset: float = Field(ge=-2.5, lt=-1)


@pytest.mark.parametrize("seed", range(3))
def test_numeric_bounds_hold(real: ServerHarness, seed: int) -> None:
    """pydantic's ge / le / gt / lt become minimum / maximum / exclusive*: enforced, so the
    SDK's validation of the parsed reply passes whatever the random model prefers."""
    out = real.openai().chat.completions.parse(model="m", messages=USER, response_format=Dimmer, max_tokens=200,
                                                temperature=1.0, seed=seed, reasoning_effort="none")
    assert out.choices[0].finish_reason == "stop" and isinstance(out.choices[0].message.parsed, Dimmer)


def test_completions_response_format(real: ServerHarness) -> None:
    """vLLM's extension on the legacy route: the text is the JSON from its first token."""
    for seed in range(2):
        out = real.openai().completions.create(
            model="m", prompt="A light:", max_tokens=200, temperature=1.0, seed=seed,
            extra_body={"response_format": {"type": "json_schema",
                                            "json_schema": {"name": "d", "schema": Dimmer.model_json_schema()}}})
        assert out.choices[0].finish_reason == "stop"
        Dimmer.model_validate_json(out.choices[0].text)
    with pytest.raises(openai.BadRequestError, match="response_format.type"):
        real.openai().completions.create(model="m", prompt="x", max_tokens=5, extra_body={"response_format": {"type": "xml"}})


class Booking(BaseModel):
    when: datetime.datetime
    day: datetime.date
    ref: uuid.UUID
    code: str = Field(pattern=r"^[A-Z]{3}-\d{2}$")


@pytest.mark.parametrize("seed", range(2))
def test_formats_and_patterns_hold(real: ServerHarness, seed: int) -> None:
    """pydantic's datetime / date / UUID fields (format) and constr patterns are enforced:
    its parse of the reply passes whatever the random model prefers."""
    out = real.openai().chat.completions.parse(model="m", messages=USER, response_format=Booking, max_tokens=300,
                                                temperature=1.0, seed=seed, reasoning_effort="none")
    assert out.choices[0].finish_reason == "stop" and isinstance(out.choices[0].message.parsed, Booking)
