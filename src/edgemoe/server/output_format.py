"""Structured outputs at the HTTP edge: each protocol's field → `StructuredOutput`.

- Chat Completions `response_format`: `{"type": "text"}`, `{"type": "json_object"}`,
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`;
- Responses `text.format`: `{"type": "text" | "json_object"}` or `{"type": "json_schema",
  "name", "schema", "strict"}`;
- Anthropic `output_config.format` (and the beta's `output_format`): `{"type":
  "json_schema", "schema"}`.

The schema is compiled here (`edgemoe.structured.Grammar`), so a schema the grammar
cannot honour is a 400 naming the client's field and the place in the schema, before the
engine sees it. Where the JSON starts (`StructuredOutput.reasoning`) is decided once the
prompt is rendered (`with_output_format`): after the model's `<think>` block when it
thinks.

A forced call to a named tool in the Hermes format (`forced_arguments`) writes the call,
not the response format: its prompt ends with `{"name": "NAME", "arguments":`, so the
output is constrained to the tool's `parameters` instead (when the grammar can honour
them; else, as before, not at all), then EOS: the parser closes the call's object.
Harmony's named call is held the same way: its opening ends with `<|message|>`, and the
`<|call|>` after the arguments is an EOS id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from edgemoe.messages import MAX_SCHEMA_BYTES, SamplingParams, StructuredOutput
from edgemoe.server.errors import bad_request
from edgemoe.server.tool_functions import tool_functions
from edgemoe.structured import Grammar, GrammarError


@dataclass(frozen=True)
class OutputFormat:
    """A checked output format: `schema` as JSON text, None for any JSON object. `target`
    "calls": the schema holds each tool call's JSON, not the content (server/call_format.py)."""

    schema: str | None
    target: str = "value"
    primed: str | None = None
    one_call: bool = False
    calls: str | None = None  # beside a response format: the tool calls' schema (the turn may be calls)
    tool_format: str = "hermes"  # how the calls are written (StructuredOutput.tool_format)


def chat_response_format(value: object) -> OutputFormat | None:
    """Chat Completions' `response_format`."""
    if value is None:
        return None
    fmt = _object(value, "response_format")
    kind = fmt.get("type")
    if kind == "json_schema":
        spec = _object(fmt.get("json_schema"), "response_format.json_schema")
        return _schema_format(spec, "response_format.json_schema.schema")
    return _plain_format(kind, "response_format.type")


def responses_text_format(text: object) -> OutputFormat | None:
    """The Responses API's `text.format`."""
    if text is None:
        return None
    fmt = _object(text, "text").get("format")
    if fmt is None:
        return None
    fmt = _object(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        return _schema_format(fmt, "text.format.schema")
    return _plain_format(kind, "text.format.type")


def anthropic_output_format(output_config: object, output_format: object) -> OutputFormat | None:
    """Anthropic's `output_config.format`, or the structured-outputs beta's `output_format`."""
    where, fmt = "output_format", output_format
    if output_config is not None:
        fmt_in_config = _object(output_config, "output_config").get("format")
        if fmt_in_config is not None:
            where, fmt = "output_config.format", fmt_in_config
    if fmt is None:
        return None
    fmt = _object(fmt, where)
    if fmt.get("type") != "json_schema":
        raise bad_request(f"{where}.type must be 'json_schema' (got {_shown(fmt.get('type'))})", param=f"{where}.type")
    return _schema_format(fmt, f"{where}.schema")


def forced_arguments(tool_format: str | None, named_tool: str | None,
                     tools: list[dict[str, Any]] | None) -> OutputFormat | None:
    """The arguments' format of a forced call to `named_tool` (Hermes and harmony: their
    openings end where the arguments object starts); None where nothing can be constrained."""
    if tool_format not in ("hermes", "harmony") or named_tool is None:
        return None
    for function in tool_functions(tools):
        if function["name"] == named_tool:
            schema = function.get("parameters")
            if schema is None or schema == {}:
                return OutputFormat(None)
            try:
                Grammar.from_schema(schema)
                return OutputFormat(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
            except (GrammarError, RecursionError, TypeError, ValueError) as exc:
                if function.get("strict") is True:  # as for any strict tool (call_format.py)
                    raise bad_request(f"tools: the strict tool {named_tool!r}'s parameters cannot be enforced: "
                                      f"{exc}", param="tools") from exc
                return None  # a schema the grammar can't honour: the call stays unconstrained
    return None


def with_output_format(params: SamplingParams, fmt: OutputFormat | None, *, thinks: bool,
                       starts_in_reasoning: bool) -> SamplingParams:
    """The engine's params for a rendered prompt: the JSON starts after a `<think>` block
    when the model thinks (inside one the prompt opened: "open"; one it may open: "start")."""
    if fmt is None:
        return params
    reasoning = ("open" if starts_in_reasoning else "start") if thinks else "none"
    spec = StructuredOutput(schema=fmt.schema, reasoning=reasoning, target=fmt.target, primed=fmt.primed,
                            one_call=fmt.one_call, calls_schema=fmt.calls, tool_format=fmt.tool_format)
    return msgspec.structs.replace(params, structured=spec)


def _plain_format(kind: object, param: str) -> OutputFormat | None:
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(None)
    raise bad_request(f"{param} must be 'text', 'json_object' or 'json_schema' (got {_shown(kind)})", param=param)


def _schema_format(spec: dict[str, Any], param: str) -> OutputFormat:
    """A json_schema format's schema, compiled to check it. No schema: any JSON object."""
    schema = spec.get("schema")
    if schema is None:
        return OutputFormat(None)
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"{param} must be a JSON Schema object (got {_shown(schema)})", param=param)
    try:  # NOTE: bodies nest at most 200 deep (json_body.py); the grammar refuses past 64
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        size = len(text.encode())
        if size > MAX_SCHEMA_BYTES:
            raise bad_request(f"{param} is {size} bytes of JSON; at most {MAX_SCHEMA_BYTES} are accepted", param=param)
        Grammar.from_schema(schema)
    except GrammarError as exc:
        where = f"{param}.{exc.path}" if exc.path else param
        raise bad_request(f"{param}: {exc}", param=where) from exc
    except RecursionError as exc:
        raise bad_request(f"{param} nests too deeply", param=param) from exc
    return OutputFormat(text)


def _object(value: object, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{param} must be an object (got {_shown(value)})", param=param)
    return value


def _shown(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 80 else text[:80] + "…"
