"""An adversarial campaign on logit_bias, `tool_choice` allowed_tools and forced tool calls:
each defect it found, as a test that failed before its fix (scripted engine, real HTTP,
the SDKs' own error classes where they apply)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_harness import MakeServer, ServerHarness
from server_scripts import TIME_TOOL, WEATHER_TOOL

from edgemoe.server.limits import LogitBiasMap

TOOLS = [WEATHER_TOOL, TIME_TOOL]
FLAT_TOOLS = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
              for t in TOOLS]
ASK = [{"role": "user", "content": "Go. [[forced_any]]"}]


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


# --------------------------------------------------------------------------- allowed_tools

CHAT_BAD_ENTRIES: list[tuple[Any, str]] = [
    ({"type": "function", "function": {"name": 5}}, "tool_choice.allowed_tools.tools[0]"),
    ({"type": "function", "function": {}}, "tool_choice.allowed_tools.tools[0]"),
    ({"type": "function"}, "tool_choice.allowed_tools.tools[0]"),
    ({"type": 7, "name": "get_weather"}, "tool_choice.allowed_tools.tools[0].type"),
]


@pytest.mark.parametrize(("entry", "param"), CHAT_BAD_ENTRIES)
def test_chat_allowed_tools_malformed_function_entry_is_400(scripted: ServerHarness, entry: Any, param: str) -> None:
    """Was a 200: the entry was skipped, the allowed set came out empty, and mode
    "required" silently became a plain answer with no tools at all."""
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [entry]}}
    with pytest.raises(openai.BadRequestError) as err:
        scripted.openai().chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice)
    assert err.value.body["param"] == param  # type: ignore[index]


RESPONSES_BAD_ENTRIES: list[tuple[Any, str]] = [
    (5, "tool_choice.tools[0]"),
    ("get_weather", "tool_choice.tools[0]"),
    ({"type": "function", "name": 5}, "tool_choice.tools[0]"),
    ({"type": "function"}, "tool_choice.tools[0]"),
    ({"type": ["function"], "name": "get_weather"}, "tool_choice.tools[0].type"),
]


@pytest.mark.parametrize(("entry", "param"), RESPONSES_BAD_ENTRIES)
def test_responses_allowed_tools_malformed_entry_is_400(scripted: ServerHarness, entry: Any, param: str) -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [entry]}
    with pytest.raises(openai.BadRequestError) as err:
        scripted.openai().responses.create(model="m", input="Go. [[forced_any]]", tools=FLAT_TOOLS,
                                           tool_choice=choice)  # type: ignore[arg-type]
    assert err.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize("mode", [None, "none", "bogus", 1])
def test_responses_allowed_tools_needs_a_mode(scripted: ServerHarness, mode: Any) -> None:
    """Was a 200 as "auto" (chat refused the same choice)."""
    choice: dict[str, Any] = {"type": "allowed_tools", "tools": [{"type": "function", "name": "get_weather"}]}
    if mode is not None:
        choice["mode"] = mode
    response = httpx.post(f"{scripted.base_url}/v1/responses", timeout=30, json={
        "model": "m", "input": "Go. [[forced_any]]", "tools": FLAT_TOOLS, "tool_choice": choice})
    assert error_of(response)["param"] == "tool_choice.mode"


def test_allowed_tools_hosted_entries_are_still_skipped(scripted: ServerHarness) -> None:
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "web_search"}, {"type": "function", "name": "get_weather"}]}
    out = scripted.openai().responses.create(model="m", input="Go. [[forced_any]]", tools=FLAT_TOOLS,
                                             tool_choice=choice)  # type: ignore[arg-type]
    assert [(i.type, getattr(i, "name", None)) for i in out.output] == [("function_call", "get_weather")]


# --------------------------------------------------------------------------- forced calls

WEATHER_ANTHROPIC = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}


def test_anthropic_count_tokens_refuses_a_named_tool_not_in_tools(scripted: ServerHarness) -> None:
    """Was a 200 with a count of a prompt that /v1/messages refuses."""
    sdk = anthropic.Anthropic(base_url=scripted.base_url, api_key="unused", max_retries=0, timeout=30)
    kwargs: dict[str, Any] = {"model": "claude-x", "messages": ASK, "tools": [WEATHER_ANTHROPIC],
                              "tool_choice": {"type": "tool", "name": "nope"}}
    with pytest.raises(anthropic.BadRequestError) as sent:
        sdk.messages.create(max_tokens=50, **kwargs)
    with pytest.raises(anthropic.BadRequestError) as counted:
        sdk.messages.count_tokens(**kwargs)
    assert counted.value.body == sent.value.body
    assert counted.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert sdk.messages.count_tokens(**{**kwargs, "tool_choice": {"type": "tool", "name": "get_weather"}}).input_tokens


def tool_named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize("name", ["a>b", "a\nb", "<x>", " padded "])
def test_qwen3_coder_named_tool_it_cannot_write_is_400(make_scripted: MakeServer, name: str) -> None:
    """`<function=a>b>` was read back as a call to `a`, a tool the client never declared
    (a 200 with a wrong name); `<function=a\\nb>` gave no call at all."""
    harness = make_scripted(tool_call_parser="qwen3_coder")
    response = httpx.post(f"{harness.base_url}/v1/chat/completions", timeout=30, json={
        "model": "m", "messages": ASK, "tools": [tool_named(name)],
        "tool_choice": {"type": "function", "function": {"name": name}}})
    assert error_of(response)["param"] == "tool_choice"


@pytest.mark.parametrize("name", ["", "   "])
def test_hermes_blank_named_tool_is_400(scripted: ServerHarness, name: str) -> None:
    """The forced opening `{"name": ""` is no call the parser accepts: it was a 200 whose
    content was the raw opening, though the call was 'forced'."""
    response = httpx.post(f"{scripted.base_url}/v1/chat/completions", timeout=30, json={
        "model": "m", "messages": ASK, "tools": [tool_named(name)],
        "tool_choice": {"type": "function", "function": {"name": name}}})
    # An empty name is refused at the tool itself now (as OpenAI's `{1,64}` name rule does).
    assert error_of(response)["param"] == ("tools[0].function.name" if name == "" else "tool_choice")


def test_writable_names_still_force(make_scripted: MakeServer) -> None:
    harness = make_scripted(tool_call_parser="qwen3_coder")
    out = harness.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Go. [[forced_xml_named]]"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert out.choices[0].message.tool_calls and out.choices[0].message.tool_calls[0].function.name == "get_weather"


# --------------------------------------------------------------------------- logit_bias


def test_logit_bias_leading_zeros_of_any_length_name_the_same_token() -> None:
    """"007" was token 7 but "00000000007" a 400 claiming the id exceeded 2147483647."""
    check = LogitBiasMap().check
    assert check({"0" * 20 + "7": -5}) == {7: -5.0}
    assert check({"0" * 5000 + "151935": 1}) == {151935: 1.0}
    assert check({"0" * 12: 1}) == {0: 1.0}
    with pytest.raises(ValueError, match="once"):
        check({"7": 1, "0" * 11 + "7": 2})
    with pytest.raises(ValueError, match="at most 2147483647"):
        check({"0" * 3 + "2147483648": 1})


def test_logit_bias_leading_zeros_over_http(scripted: ServerHarness) -> None:
    for path, extra in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "hi"})):
        response = httpx.post(f"{scripted.base_url}{path}", timeout=30, json={
            "model": "m", "max_tokens": 2, "logit_bias": {"0" * 12 + "7": -100}, **extra})
        assert response.status_code == 200, response.text
    assert scripted.engine.seen[-1][1].logit_bias == {7: -100.0}  # type: ignore[attr-defined]
