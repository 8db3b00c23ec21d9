"""Tool calls held to their tools' schemas (Hermes format): which requests, and the
engine's `StructuredOutput(target="calls")` for them.

A request's calls are constrained when the model writes Hermes calls, tools are active,
and either `tool_choice` forces a call ("required": the prompt ends with the call's
opening) or a tool is `strict` (OpenAI's `function.strict`, Anthropic's `strict`). Then
every call the model opens with `<tool_call>` is made to be `{"name": N, "arguments": A}`
with N one of the tools' names and A valid for that tool's parameters, or, for a tool
that is not strict and whose parameters the grammar cannot honour, any JSON object. A
strict tool whose parameters the grammar cannot honour is a 400 naming the tool: the
client asked for a guarantee the server cannot give. Text around the calls is free.

A forced call to a named tool is `output_format.forced_arguments`; a response format
(`response_format`, …) holds the content instead, and no call is constrained.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from edgemoe.server.errors import bad_request
from edgemoe.server.output_format import OutputFormat
from edgemoe.structured import Grammar, GrammarError
from edgemoe.structured.call_schema import call_schema

CALL_OPEN = "<tool_call>"
_REFUSED = (GrammarError, RecursionError, TypeError, ValueError)


def call_format(tool_format: str | None, tools: list[dict[str, Any]] | None, forced: str,
                one_call: bool = False) -> OutputFormat | None:
    """The calls' format of a request with active `tools` (`forced`: the forced opening its
    prompt ends with, '' for none; `one_call`: parallel calls off); None where calls are not
    constrained."""
    if tool_format != "hermes" or not tools:
        return None
    entries = _entries(tools)
    if not entries or not (forced or any(strict for _, _, strict in entries)):
        return None
    schema = _checked(json.dumps(entries, ensure_ascii=False, separators=(",", ":")))
    if schema is None:
        return None
    primed = None
    if forced:
        assert forced.startswith(CALL_OPEN), forced
        primed = forced[len(CALL_OPEN):]
    return OutputFormat(schema, target="calls", primed=primed, one_call=one_call)


def _entries(tools: list[dict[str, Any]]) -> list[tuple[str, object, bool]]:
    """(name, parameters, strict) of each function tool."""
    entries = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        if isinstance(function.get("name"), str):
            entries.append((function["name"], function.get("parameters"), function.get("strict") is True))
    return entries


@lru_cache(maxsize=64)
def _checked(entries_json: str) -> str | None:
    """The call schema's JSON text for the tools (as JSON: an agent sends the same ones
    every turn); None where a non-strict set can't be constrained; 400 for a strict tool."""
    entries = json.loads(entries_json)
    tools = [(name, _arguments(name, parameters, strict)) for name, parameters, strict in entries]
    schema = call_schema(tools)
    try:
        Grammar.from_schema(schema)
    except _REFUSED as exc:
        if any(strict for _, _, strict in entries):
            raise bad_request(f"tools: the strict tools' calls cannot be constrained together: {exc}",
                              param="tools") from exc
        return None
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _arguments(name: str, parameters: object, strict: bool) -> object | None:
    """A tool's arguments schema for the call: its parameters, None for any JSON object (no
    parameters, or a non-strict tool's the grammar refuses)."""
    if parameters is None or parameters == {} or parameters is True:
        return None
    try:
        Grammar.from_schema(parameters)
    except _REFUSED as exc:  # a GrammarError says where in the schema
        if strict:
            raise bad_request(f"tools: the strict tool {name!r}'s parameters cannot be enforced: {exc}",
                              param="tools") from exc
        return None
    return parameters
