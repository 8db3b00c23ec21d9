"""`tool_choice: {type: "allowed_tools"}`: the model may call only the tools it names.

Chat Completions nests the list (`{allowed_tools: {mode, tools: [{type: "function",
function: {name}}]}}`), Responses keeps it flat (`{mode, tools: [{type: "function",
name}]}`); both lists may name hosted tools, which this server has none of (skipped).

Without constrained decoding the restriction is what the template shows: only the allowed
function tools reach the prompt and the parser, so the model cannot learn of the others.
(OpenAI's point of the choice is to keep the tool list, and so the prompt cache, stable
while the allowed set changes; here a changed set changes the prompt's tool section.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgemoe.server.errors import bad_request


def entry_name(entry: object) -> str | None:
    """The function name an allowed-tools entry gives (either protocol's shape), or None
    for a hosted tool."""
    if not isinstance(entry, Mapping) or entry.get("type", "function") != "function":
        return None
    function = entry.get("function")
    name = function.get("name") if isinstance(function, Mapping) else entry.get("name")
    return name if isinstance(name, str) else None


def restrict(tools: list[dict[str, Any]] | None, entries: list[Any], param: str) -> list[dict[str, Any]] | None:
    """The chat-shaped function `tools` the `entries` allow, in `tools`' order (None when
    none is); an entry naming a function that is not among `tools`, or one that is not an
    object, has a `type` that is not a string or is a function without a string name, is a
    400 naming `param` (or the entry)."""
    for i, entry in enumerate(entries):
        _check_entry(entry, f"{param}[{i}]")
    names = {name for name in map(entry_name, entries) if name is not None}
    defined = {tool["function"]["name"] for tool in tools or []}
    unknown = sorted(names - defined)
    if unknown:
        raise bad_request(f"{param}: {', '.join(map(repr, unknown))} not among the function tools", param=param)
    kept = [tool for tool in tools or [] if tool["function"]["name"] in names]
    return kept or None


def _check_entry(entry: object, where: str) -> None:
    """A malformed entry is a 400: skipped, it would silently widen or empty the allowed set."""
    if not isinstance(entry, Mapping):
        raise bad_request(f"{where} must be an object", param=where)
    if not isinstance(entry.get("type", "function"), str):
        raise bad_request(f"{where}.type must be a string", param=f"{where}.type")
    if entry.get("type", "function") == "function" and entry_name(entry) is None:
        raise bad_request(f"{where}: a function entry needs a 'name' (a string)", param=where)
