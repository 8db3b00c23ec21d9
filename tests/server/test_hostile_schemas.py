"""Regressions from a hostile-client campaign on structured outputs, tools and
conversations (scripted engine, real HTTP, the SDKs' own error classes):

- a `pattern` that is no regular expression, or a `pattern` / `format` that is no string,
  was accepted and silently left unenforced on every route (the client believed its
  strings were held to it): now a 400 naming the place in the schema;
- a conversation with nothing to answer (Anthropic: only an assistant prefill; Responses:
  only reasoning or skipped tool items) reached the chat template, whose error ("list object
  has no element 0") was the client's 400 message, under the wrong `param` for Responses.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_harness import ServerHarness

ASK = [{"role": "user", "content": "hi"}]
BAD_STRINGS = [({"type": "string", "pattern": "([a-"}, "pattern"),
               ({"type": "string", "pattern": "a{5,2}"}, "pattern"),
               ({"type": "object", "properties": {"s": {"type": "string", "pattern": 5}}}, "properties.s.pattern"),
               ({"type": "string", "format": 5}, "format")]


def _anthropic(server: ServerHarness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


def _object(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters: the schema under property `v` (arguments are an object)."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


@pytest.mark.parametrize(("schema", "where"), BAD_STRINGS)
def test_a_malformed_string_rule_is_400_on_every_route(scripted: ServerHarness, schema: dict[str, Any],
                                                       where: str) -> None:
    client = scripted.openai()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert err.value.body["param"] == f"response_format.json_schema.schema.{where}"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="hi", max_output_tokens=4, text={"format": {
            "type": "json_schema", "name": "x", "schema": schema, "strict": True}})
    assert err.value.body["param"] == f"text.format.schema.{where}"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, tools=[{"type": "function", "function": {
            "name": "f", "parameters": _object(schema), "strict": True}}])
    assert f"properties.v.{where}" in err.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as aerr:
        _anthropic(scripted).messages.create(model="m", messages=ASK, max_tokens=4, extra_body={
            "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert aerr.value.body["type"] == "error" and where in aerr.value.body["error"]["message"]


@pytest.mark.parametrize("pattern", [r"(?=a)b", r"^(a)\1$", "[]", "(?<name"])
def test_patterns_outside_the_subset_are_still_served(scripted: ServerHarness, pattern: str) -> None:
    """Only what is no regex is refused: the documented unenforced ones still serve."""
    out = scripted.openai().chat.completions.create(model="m", messages=ASK, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": pattern}}})
    assert out.choices[0].finish_reason in ("stop", "length")


def test_an_anthropic_prefill_alone_is_a_clear_400(scripted: ServerHarness) -> None:
    client = _anthropic(scripted)
    for system in ({}, {"system": ""}):
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model="m", max_tokens=4, messages=[{"role": "assistant", "content": "x"}], **system)
        assert "conversation is empty" in err.value.body["error"]["message"]
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.count_tokens(model="m", messages=[{"role": "assistant", "content": "x"}], **system)
        assert "conversation is empty" in err.value.body["error"]["message"]
    out = client.messages.create(model="m", max_tokens=4, messages=[*ASK, {"role": "assistant", "content": "x"}])
    assert out.content  # a prefill after a user message still continues


@pytest.mark.parametrize("item", [{"type": "reasoning", "id": "rs_1", "summary": []},
                                  {"type": "custom_tool_call", "call_id": "c", "name": "x", "input": "y"},
                                  {"type": "local_shell_call", "call_id": "c", "action": {}}])
def test_responses_input_with_nothing_to_answer_is_a_clear_400(scripted: ServerHarness, item: dict[str, Any]) -> None:
    r = httpx.post(f"{scripted.base_url}/v1/responses", timeout=30,
                   json={"model": "m", "input": [item], "max_output_tokens": 4})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and "conversation is empty" in error["message"], error
    ok = httpx.post(f"{scripted.base_url}/v1/responses", timeout=30,
                    json={"model": "m", "input": [item, {"role": "user", "content": "hi"}], "max_output_tokens": 4})
    assert ok.status_code == 200, ok.text



def _anthropic_body(k: object, where: str) -> dict[str, Any]:
    if where == "system":
        return {"model": "m", "max_tokens": 4, "system": [{"type": k}], "messages": ASK}
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": k}]}]}


def _chat_body(k: object, where: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": k, "text": "hi"}]}]}


def _responses_body(k: object, where: str) -> dict[str, Any]:
    item = {"item": {"type": k}, "role": {"type": "message", "role": k, "content": "hi"},
            "part": {"role": "user", "content": [{"type": k, "text": "hi"}]}}[where]
    return {"model": "m", "max_output_tokens": 4, "input": [item]}


@pytest.mark.parametrize("kind", [[], {}, [["image"]]])
@pytest.mark.parametrize(("path", "where"), [
    ("/v1/messages", "system"), ("/v1/messages", "content"), ("/v1/messages/count_tokens", "system"),
    ("/v1/responses", "item"), ("/v1/responses", "role"), ("/v1/responses", "part"),
    ("/v1/chat/completions", "part"),
])
def test_a_list_or_object_where_a_name_goes_is_400(scripted: ServerHarness, path: str, where: str,
                                                   kind: object) -> None:
    """A content block's or part's `type`, an item's `type` or `role` that is a list or an object
    was hashed for a set lookup: a TypeError, a 500 (the schema fuzz found it on count_tokens).
    Now the 400 any unknown name gets."""
    make = {"/v1/responses": _responses_body, "/v1/chat/completions": _chat_body}.get(path, _anthropic_body)
    body = make(kind, where)
    r = httpx.post(f"{scripted.base_url}{path}", timeout=30, json=body)
    assert r.status_code == 400, r.text
