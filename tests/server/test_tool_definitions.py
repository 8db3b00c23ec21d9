"""A function tool whose fields are not what the protocol takes is refused with a 400 in
the protocol's shape on every route, as Chat Completions refuses it (a schema that is no
object would otherwise leave the model's calls unconstrained, silently)."""

from __future__ import annotations

from typing import Any

import anthropic as anthropic_sdk
import httpx
import openai
import pytest
from server_harness import ServerHarness

USER = [{"role": "user", "content": "hi"}]


def anthropic(tool: dict[str, Any], **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {"model": "m", "max_tokens": 4, "messages": USER, "tools": [tool], **extra}


def responses(tool: dict[str, Any], **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": "m", "max_output_tokens": 4, "input": "hi", "tools": [tool], **extra}


REFUSED = [
    (anthropic({"name": "f", "input_schema": "x"}), "tools[0].input_schema"),
    (anthropic({"name": "f", "input_schema": [1]}, tool_choice={"type": "any"}), "tools[0].input_schema"),
    (anthropic({"name": "f", "input_schema": 5}, tool_choice={"type": "tool", "name": "f"}), "tools[0].input_schema"),
    (anthropic({"name": "f", "description": 5}), "tools[0].description"),
    (anthropic({"name": "f", "strict": "yes"}), "tools[0].strict"),
    (responses({"type": "function", "name": "f", "parameters": "x"}, tool_choice="required"), "tools[0].parameters"),
    (responses({"type": "function", "name": "f", "parameters": [1]}), "tools[0].parameters"),
    (responses({"type": "function", "name": "f", "description": 5}), "tools[0].description"),
    (responses({"type": "function", "name": "f", "strict": "yes"}), "tools[0].strict"),
    (responses({"type": "function"}), "tools[0].name"),
    (responses({"type": "function", "name": 7}), "tools[0].name"),
]


@pytest.mark.parametrize(("request_", "field"), REFUSED, ids=[f"{r[0]}:{f}" for r, f in REFUSED])
def test_a_function_tool_of_wrong_types_is_400_naming_the_field(
    scripted: ServerHarness, request_: tuple[str, dict[str, Any]], field: str
) -> None:
    path, body = request_
    assert_refused_naming(scripted, path, body, field)
    if path == "/v1/messages":  # the token count reads the same tools
        count = httpx.post(f"{scripted.base_url}/v1/messages/count_tokens",
                           json={k: body[k] for k in ("model", "messages", "tools")}, timeout=30)
        assert count.status_code == 400 and field in count.json()["error"]["message"]


@pytest.mark.parametrize("request_", [
    anthropic({"name": "f", "input_schema": {"type": "object"}, "description": "d", "strict": True}),
    anthropic({"name": "f"}),  # a schema is optional here: an object of anything
    anthropic({"type": "web_search_20250305", "name": "web_search", "max_uses": 1}),  # a server tool: skipped
    responses({"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False}),
    responses({"type": "function", "name": "f", "parameters": None, "description": None}),
    responses({"type": "web_search"}),  # a hosted tool: not a function, skipped
])
def test_well_formed_tools_are_taken(scripted: ServerHarness, request_: tuple[str, dict[str, Any]]) -> None:
    path, body = request_
    r = httpx.post(f"{scripted.base_url}{path}", json=body, timeout=30)
    assert r.status_code == 200, r.text


def chat(*tools: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": "m", "max_tokens": 4, "messages": USER,
                                    "tools": [{"type": "function", "function": t} for t in tools]}


def many(make: Any, *tools: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    path, body = make(tools[0])
    return path, {**body, "tools": list(tools)}


F = {"type": "object", "properties": {"x": {"type": "string"}}}
NAMES_REFUSED = [
    (chat({"name": "f", "parameters": F}, {"name": "f", "parameters": {"type": "object"}}), "tools[1].function.name"),
    (chat({"name": "", "parameters": F, "strict": True}), "tools[0].function.name"),
    (many(responses, {"type": "function", "name": "f"}, {"type": "web_search"}, {"type": "function", "name": "f"}),
     "tools[2].name"),
    (responses({"type": "function", "name": "", "parameters": F, "strict": True}), "tools[0].name"),
    (many(anthropic, {"name": "f"}, {"name": "f", "input_schema": F}), "tools[1].name"),
    (many(anthropic, {"type": "web_search_20250305", "name": "web_search"}, {"name": "web_search"}), "tools[1].name"),
    (anthropic({"name": "", "strict": True}), "tools[0].name"),
]


@pytest.mark.parametrize(("request_", "field"), NAMES_REFUSED, ids=[f"{r[0]}:{f}" for r, f in NAMES_REFUSED])
def test_an_empty_or_repeated_tool_name_is_400(scripted: ServerHarness, request_: tuple[str, dict[str, Any]],
                                               field: str) -> None:
    """Both real APIs refuse them (Anthropic: "tools: Tool names must be unique."); a call to a
    repeated name could not say whose schema holds its arguments."""
    assert_refused_naming(scripted, *request_, field)


def assert_refused_naming(server: ServerHarness, path: str, body: dict[str, Any], field: str) -> None:
    """A 400 in the route's protocol shape whose message names `field` (and, on OpenAI's routes, its param)."""
    r = httpx.post(f"{server.base_url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error["message"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["param"] == field


def test_the_sdks_see_a_repeated_tool_name_refused(scripted: ServerHarness) -> None:
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": F}}
    with pytest.raises(openai.BadRequestError, match="unique"):
        scripted.openai().chat.completions.create(model="m", messages=USER, tools=[tool, tool])  # type: ignore
    client = anthropic_sdk.Anthropic(base_url=scripted.base_url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(anthropic_sdk.BadRequestError, match="Tool names must be unique"):
        client.messages.create(model="m", max_tokens=4, messages=USER,  # type: ignore[arg-type]
                               tools=[{"name": "f", "input_schema": F}] * 2)
