"""Tool calls held to their tools' schemas in the Qwen3-Coder XML format (Qwen3.5/3.6):
the demo model (random weights) served with the Qwen3.5 chat template, whose calls the
qwen3_coder parser reads. Strict tools and forced calls make every call the model writes
valid — checked by the openai SDK's own parsing into the pydantic model and by
`jsonschema_rs` — on Chat, Responses and Anthropic; a strict tool whose schema the XML
format can't hold is a 400 naming the tool and the parameter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from server_harness import ServerHarness, demo_with_template
from strict_call_support import MIXED, NOTE, USER, SetLight, check, function, served

from edgemoe.assets.chat_template import QWEN3_5_CHAT_TEMPLATE

OPEN_CALL = 151657  # <tool_call> in the demo model's (Qwen3's) vocabulary


@pytest.fixture(scope="module")
def xml(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHarness]:
    yield from served(demo_dir, demo_with_template(demo_dir, tmp_path_factory.mktemp("qwen35"), QWEN3_5_CHAT_TEMPLATE))


@pytest.mark.parametrize("choice, bias, seed", [
    ("required", None, 5), ("required", None, 6), ("auto", {str(OPEN_CALL): 30}, 5),
    ({"type": "function", "function": {"name": "SetLight"}}, None, 7),
])
def test_parse_helper_reads_every_call(xml: ServerHarness, choice: Any, bias: dict | None, seed: int) -> None:
    """`auto`: logit_bias makes the random model open a call; the mask does the rest."""
    out = xml.openai().chat.completions.parse(
        model="m", messages=USER, tools=[openai.pydantic_function_tool(SetLight), function("note", NOTE, True)],
        tool_choice=choice, parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=seed,
        reasoning_effort="none", **({"logit_bias": bias} if bias else {}))
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.tool_calls, message
    call = message.tool_calls[0].function
    if call.name == "SetLight":
        assert isinstance(call.parsed_arguments, SetLight)
    check(call.name, call.arguments)
    if isinstance(choice, dict):
        assert call.name == "SetLight"


def test_streamed_required_call_is_valid(xml: ServerHarness) -> None:
    stream = xml.openai().chat.completions.create(
        model="m", messages=USER, tools=[function("note", NOTE, True)], tool_choice="required", max_tokens=200,
        temperature=1.0, seed=11, stream=True, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    arguments = "".join(d.function.arguments or "" for chunk in stream for c in chunk.choices
                        for d in c.delta.tool_calls or [] if d.function)
    check("note", arguments)


def test_responses_and_anthropic_strict_tools(xml: ServerHarness) -> None:
    out = xml.openai().responses.create(
        model="m", input="Note it.", tools=[{"type": "function", "name": "note", "parameters": NOTE, "strict": True}],
        tool_choice="required", max_output_tokens=200, temperature=1.0, reasoning={"effort": "none"})
    calls = [item for item in out.output if item.type == "function_call"]
    assert calls and all(check("note", c.arguments) is None for c in calls)
    client = anthropic.Anthropic(base_url=xml.base_url, api_key="unused", max_retries=0, timeout=60)
    message = client.messages.create(model="m", max_tokens=200, messages=USER, thinking={"type": "disabled"},
                                     tools=[{"name": "note", "input_schema": NOTE, "strict": True}],
                                     tool_choice={"type": "any"})
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and all(check("note", u.input) is None for u in uses)


def test_a_strict_tool_the_xml_format_cannot_hold_is_a_400(xml: ServerHarness) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        xml.openai().chat.completions.create(model="m", messages=USER, max_tokens=5,
                                             tools=[function("odd", MIXED, True)])
    assert info.value.status_code == 400 and "'odd'" in str(info.value) and "properties.a" in str(info.value)


def test_a_non_strict_tool_it_cannot_hold_still_serves(xml: ServerHarness) -> None:
    out = xml.openai().chat.completions.create(model="m", messages=USER, max_tokens=60, tool_choice="required",
                                               tools=[function("odd", MIXED), function("note", NOTE)],
                                               temperature=1.0, seed=2)
    assert out.choices[0].finish_reason in ("tool_calls", "stop", "length")
    for call in out.choices[0].message.tool_calls or []:
        assert call.function.name in ("odd", "note")
        if call.function.name == "note":
            check("note", call.function.arguments)


def test_a_response_format_beside_tools_allows_xml_calls(xml: ServerHarness) -> None:
    """The turn is the JSON or calls (the first token picks); pushed to call, the call is valid."""
    out = xml.openai().chat.completions.parse(
        model="m", messages=USER, tools=[function("note", NOTE, True)], response_format=SetLight, max_tokens=300,
        temperature=1.0, seed=4, reasoning_effort="none", logit_bias={str(OPEN_CALL): 30}, parallel_tool_calls=False)
    message = out.choices[0].message
    assert message.tool_calls and not message.content
    check(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)


def test_too_many_parameters_for_a_strict_tool(xml: ServerHarness) -> None:
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(65)}}
    with pytest.raises(openai.BadRequestError, match="'wide'"):
        xml.openai().chat.completions.create(model="m", messages=USER, max_tokens=5, tools=[function("wide", wide, True)])
    out = xml.openai().chat.completions.create(model="m", messages=USER, max_tokens=20, tools=[function("wide", wide)],
                                               tool_choice="required")
    assert out.choices[0].finish_reason in ("tool_calls", "stop", "length")
