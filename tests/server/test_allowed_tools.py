"""`tool_choice: {type: "allowed_tools"}` on Chat Completions and Responses: only the
allowed function tools reach the prompt and the parser; an unknown name is a 400."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from server_harness import ServerHarness
from server_scripts import TIME_TOOL, WEATHER_TOOL

from edgemoe.server.allowed_tools import entry_name, restrict
from edgemoe.server.errors import APIError
from edgemoe.server.responses_protocol import ResponsesRequest
from edgemoe.tokenizer import TokenizerBundle

TOOLS = [WEATHER_TOOL, TIME_TOOL]


def allowed(mode: str, *names: str) -> dict[str, Any]:
    entries = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": entries}}


def test_entry_names_in_both_shapes() -> None:
    assert entry_name({"type": "function", "function": {"name": "a"}}) == "a"
    assert entry_name({"type": "function", "name": "b"}) == "b"
    assert entry_name({"type": "web_search"}) is None
    assert entry_name({"type": "function"}) is None
    assert entry_name("get_weather") is None


def test_restrict_keeps_the_tools_order_and_refuses_unknown_names() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b", "c")]
    kept = restrict(tools, [{"type": "function", "name": "c"}, {"type": "function", "name": "a"}], "p")
    assert kept == [tools[0], tools[2]]
    assert restrict(tools, [{"type": "mcp", "server_label": "x"}], "p") is None
    with pytest.raises(APIError) as err:
        restrict(tools, [{"type": "function", "name": "d"}], "tool_choice.tools")
    assert err.value.status == 400 and err.value.param == "tool_choice.tools" and "'d'" in err.value.message


def test_responses_allowed_tools_restrict_the_chat_tools() -> None:
    tools = [{"type": "function", "name": "f"}, {"type": "function", "name": "g"}, {"type": "web_search"}]
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "g"}, {"type": "web_search"}]}
    req = ResponsesRequest(input="x", tools=tools, tool_choice=choice)
    assert req.chat_tools() == [{"type": "function", "function": {"name": "g"}}]
    assert req.tool_choice_mode() == ("required", None)
    with pytest.raises(APIError) as err:
        ResponsesRequest(input="x", tools=tools, tool_choice={**choice, "tools": "g"}).chat_tools()
    assert err.value.param == "tool_choice.tools"


def test_chat_allowed_tools_show_only_the_allowed(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = scripted.openai()
    # "required": the call is forced, so the script is the rest of a call after its opening.
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Go. [[forced_any]]"}],
                                         tools=TOOLS, tool_choice=allowed("required", "get_weather"))
    prompt = demo_tokenizer.decode(scripted.engine.seen[-1][0])  # type: ignore[attr-defined]
    assert "get_weather" in prompt and "get_time" not in prompt
    (call,) = out.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"


def test_chat_allowed_tools_without_a_function_hides_all(scripted: ServerHarness,
                                                         demo_tokenizer: TokenizerBundle) -> None:
    body = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "custom", "name": "x"}]}}
    scripted.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                              tool_choice=body)  # type: ignore[arg-type]
    prompt = demo_tokenizer.decode(scripted.engine.seen[-1][0])  # type: ignore[attr-defined]
    assert "get_weather" not in prompt and "get_time" not in prompt


@pytest.mark.parametrize(("choice", "param"), [
    (allowed("auto", "get_weather", "no_such_tool"), "tool_choice.allowed_tools.tools"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": []}}, None),
    ({"type": "allowed_tools"}, None),
])
def test_chat_allowed_tools_refusals(scripted: ServerHarness, choice: dict[str, Any], param: str | None) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        scripted.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                  tools=TOOLS, tool_choice=choice)  # type: ignore[arg-type]
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict) and body.get("type") == "invalid_request_error"
    if param is not None:
        assert body.get("param") == param and "no_such_tool" in body.get("message", "")
    else:
        assert str(body.get("param", "")).startswith("tool_choice")


@pytest.mark.parametrize("tools,choice", [
    (None, "required"),
    (TOOLS, {"type": "allowed_tools",
             "allowed_tools": {"mode": "required", "tools": [{"type": "custom", "name": "x"}]}}),
])
def test_chat_required_without_a_function_tool_is_400(scripted: ServerHarness, tools: Any, choice: Any) -> None:
    """Nothing to force a call of (vLLM refuses it too); it was answered as `auto`."""
    extra = {"tools": tools} if tools else {}
    with pytest.raises(openai.BadRequestError) as err:
        scripted.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                  tool_choice=choice, **extra)
    assert isinstance(err.value.body, dict) and err.value.body.get("param") == "tool_choice"
    out = scripted.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                    tool_choice="auto")  # auto without tools stays fine
    assert out.choices[0].message.tool_calls is None
