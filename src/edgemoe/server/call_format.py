"""Tool calls held to their tools' schemas (Hermes JSON, Qwen3-Coder or MiniMax-M2 XML):
which requests, and the engine's `StructuredOutput(target="calls")` for them.

A request's calls are constrained when the model writes tagged calls, tools are active,
and either `tool_choice` forces a call ("required": the prompt ends with the call's
opening) or a tool is `strict` (OpenAI's `function.strict`, Anthropic's `strict`). Then
every call the model opens with `<tool_call>` is made to be `{"name": N, "arguments": A}`
with N one of the tools' names and A valid for that tool's parameters, or, for a tool
that is not strict and whose parameters the grammar cannot honour, any JSON object. A
strict tool whose parameters the grammar cannot honour is a 400 naming the tool: the
client asked for a guarantee the server cannot give. Text around the calls is free.

In the qwen3_coder format (Qwen3.5/3.6, Qwen3-Coder) each call is
`<function=NAME>` and one `<parameter=KEY>` block per argument, each value raw text the
parser types by the schema: `structured/xml_tools.py` says which schemas can be held
(a parameter that may be a string or another type can't: a 400 for a strict tool). The
minimax_m2 format (MiniMax-M2/M2.1/M2.5) is held the same way: a `<minimax:tool_call>`
block of `<invoke name="NAME">` calls, `<parameter name="KEY">VALUE</parameter>` each,
typed alike; one invoke per block with parallel calls off.

A forced call to a named tool is `output_format.forced_arguments`; a response format
(`response_format`, …) holds the content instead, and no call is constrained.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from edgemoe.messages import MAX_SCHEMA_BYTES
from edgemoe.server.errors import bad_request
from edgemoe.server.output_format import OutputFormat
from edgemoe.server.tool_functions import tool_functions
from edgemoe.structured import Grammar, GrammarError
from edgemoe.structured.call_schema import call_schema, rebase_refs
from edgemoe.structured.call_tokens import tag_texts
from edgemoe.structured.keywords import ANNOTATIONS
from edgemoe.structured.xml_calls import SPELLINGS
from edgemoe.structured.xml_tools import nameable, xml_tool

XML_FORMATS = tuple(SPELLINGS)  # qwen3_coder, minimax_m2
HELD_FORMATS = ("hermes", *XML_FORMATS)  # the call formats whose calls can be held
CACHED_KEY_BYTES = 1 << 20  # tool sets up to this much JSON have their checked schema cached
MAX_TOOLS = 512  # constrained calls over at most this many tools (OpenAI takes 128 a request)
_REFUSED = (GrammarError, RecursionError, TypeError, ValueError)


def call_format(tool_format: str | None, tools: list[dict[str, Any]] | None, forced: str,
                one_call: bool = False, always: bool = False, strict_default: bool = False) -> OutputFormat | None:
    """The calls' format of a request with active `tools` (`forced`: the forced opening its
    prompt ends with, '' for none; `one_call`: parallel calls off; `always`: whether or not
    a tool is strict, as beside a response format; `strict_default`: a tool that doesn't
    say `strict` is held too, without the 400 — the Responses API's default); None where
    calls are not constrained. Compiles schemas: call it off the event loop."""
    if tool_format not in HELD_FORMATS or not tools:
        return None
    functions = tool_functions(tools)
    entries = _entries(functions)
    strict = any(s for _, _, s in entries)
    unsaid = strict_default and any(f.get("strict") is None for f in functions)
    if not entries or not (forced or strict or unsaid or always):
        return None
    if len(entries) > MAX_TOOLS:  # each tool's schema is compiled: bound the work a request asks for
        if strict:
            raise bad_request(f"tools: strict calls are enforced over at most {MAX_TOOLS} tools "
                              f"(got {len(entries)})", param="tools")
        return None
    key = json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
    cached = len(key) <= CACHED_KEY_BYTES  # a larger set is checked every time, not kept
    if tool_format == "hermes":
        schema = _checked(key) if cached else _checked.__wrapped__(key)
    else:
        schema = _checked_xml(key, tool_format) if cached else _checked_xml.__wrapped__(key, tool_format)
    if schema is None:
        return None
    primed = None
    if forced:  # the call's opening tag is one token of the prompt; the grammar starts after it
        open_tag = tag_texts(tool_format)[0].decode()
        assert forced.startswith(open_tag), forced
        primed = forced[len(open_tag):]
    return OutputFormat(schema, target="calls", primed=primed, one_call=one_call, tool_format=tool_format)


def named_call_format(tool_format: str | None, tools: list[dict[str, Any]] | None, name: str,
                      forced: str) -> OutputFormat | None:
    """A forced call to the tool `name` in an XML format (qwen3_coder, minimax_m2): the one
    call, to that tool, held to its parameters as a strict call's are (strict or not, as
    Hermes' forced arguments are: `output_format.forced_arguments`). Compiles: off the event loop."""
    if tool_format not in XML_FORMATS or not forced:
        return None
    named = [t for t in tools or [] if any(f["name"] == name for f in tool_functions([t]))]
    return call_format(tool_format, named, forced, one_call=True) if named else None


def _entries(functions: list[Mapping[str, Any]]) -> list[tuple[str, object, bool]]:
    """(name, parameters, strict) of each function tool, its parameters without annotations
    (descriptions are most of a tool set's bytes; neither grammar reads them)."""
    return [(f["name"], rebase_refs(f.get("parameters"), "#", drop=ANNOTATIONS), f.get("strict") is True)
            for f in functions]


@lru_cache(maxsize=64)
def _checked(entries_json: str) -> str | None:
    """The call schema's JSON text for the tools (as JSON: an agent sends the same ones
    every turn); None where a non-strict set can't be constrained; 400 for a strict tool."""
    entries = json.loads(entries_json)
    strict = any(s for _, _, s in entries)
    schema = call_schema([(name, _arguments(name, parameters, s)) for name, parameters, s in entries])
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode())
    try:
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the tools' schemas are {size} bytes of JSON without their descriptions; at most "
                             f"{MAX_SCHEMA_BYTES} can be enforced")
        Grammar.from_schema(schema)
    except _REFUSED as exc:
        if strict:
            raise bad_request(f"tools: the strict tools' calls cannot be enforced: {exc}", param="tools") from exc
        return None
    return text


@lru_cache(maxsize=64)
def _checked_xml(entries_json: str, tool_format: str) -> str | None:
    """The XML calls' text for the tools (their entries, checked: a strict tool that can't be
    held in `tool_format` is a 400 naming it; the others are held loosely where they can't be)."""
    spelling = SPELLINGS[tool_format]
    entries = json.loads(entries_json)
    size = len(entries_json.encode())
    if size > MAX_SCHEMA_BYTES:
        if any(s for _, _, s in entries):
            raise bad_request(f"tools: the tools' schemas are {size} bytes of JSON without their descriptions; "
                              f"at most {MAX_SCHEMA_BYTES} can be enforced", param="tools")
        return None
    held = 0
    for name, parameters, strict in entries:
        if not strict:  # held as far as it can be, never refused: only its name matters here
            held += nameable(name, spelling)
            continue
        try:
            xml_tool(name, parameters, strict, spelling)
        except GrammarError as exc:
            raise bad_request(f"tools: the strict tool {name!r}'s parameters cannot be enforced in the "
                              f"{tool_format} call format: {exc}", param="tools") from exc
        held += 1
    return entries_json if held else None  # none a tag can name: nothing to hold


def _arguments(name: str, parameters: object, strict: bool) -> object | None:
    """A tool's arguments schema for the call: its parameters, None for any JSON object (no
    parameters, or a non-strict tool's that the grammar refuses or that allow no object)."""
    if parameters is None or parameters == {} or parameters is True:
        return None
    try:  # the tool's own call: its parameters as the grammar takes them, and as an object
        Grammar.from_schema(call_schema([(name, parameters)]))
        return parameters
    except _REFUSED as exc:
        wrapped = exc
    try:  # refused: say why (a GrammarError on the parameters alone names the place)
        Grammar.from_schema(parameters)
    except _REFUSED as exc:
        return _refused(name, strict, str(exc) or type(exc).__name__, exc)
    return _refused(name, strict, "its parameters allow no JSON object (a call's arguments are one)", wrapped)


def _refused(name: str, strict: bool, why: str, exc: Exception) -> None:
    """A tool whose calls can't be held to its parameters: any JSON object, or a 400 if strict."""
    if strict:
        raise bad_request(f"tools: the strict tool {name!r}'s parameters cannot be enforced: {why}",
                          param="tools") from exc
