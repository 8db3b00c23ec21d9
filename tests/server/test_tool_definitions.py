"""A function tool whose fields are not what the protocol takes is refused with a 400 in
the protocol's shape on every route, as Chat Completions refuses it (a schema that is no
object would otherwise leave the model's calls unconstrained, silently)."""

from __future__ import annotations

from typing import Any

import httpx
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
    r = httpx.post(f"{scripted.base_url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error["message"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["param"] == field
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
