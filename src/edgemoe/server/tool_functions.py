"""A request's function tools as the routes hold them, whichever protocol sent them
(its own module: the forced call, the output formats and the strict calls all read it,
and the request type imports the output formats)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edgemoe.server.api_error import bad_request

# A function definition's optional fields and the JSON type each must have when present (Chat
# Completions' `FunctionDefinition` holds them so): OpenAI and Anthropic answer 400 otherwise,
# and a schema that is no object would leave the model's calls unconstrained, silently.
_FIELD_TYPES = (("description", str, "a string"), ("parameters", dict, "a JSON Schema object"),
                ("strict", bool, "a boolean"))


def tool_functions(tools: list[dict[str, Any]] | None) -> list[Mapping[str, Any]]:
    """Each function tool's definition that has a name (`{"type": "function", "function":
    {...}}` as the routes give them, or the definition itself)."""
    out = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        if isinstance(function.get("name"), str):
            out.append(function)
    return out


def check_function(tool: Mapping[str, Any], where: str, parameters: str = "parameters") -> None:
    """400 unless `tool` (a flat definition: Responses' function tool, Anthropic's custom
    tool with its schema under `parameters`=`input_schema`) has a string name and its other
    fields, where given, the types Chat Completions takes."""
    if not isinstance(tool.get("name"), str):
        raise bad_request(f"{where}.name: field required (a string)", param=f"{where}.name")
    for name, kind, what in _FIELD_TYPES:
        field = parameters if name == "parameters" else name
        value = tool.get(field)
        if value is not None and not isinstance(value, kind):
            raise bad_request(f"{where}.{field}: must be {what}", param=f"{where}.{field}")


def check_names(names: Iterable[tuple[object, str]]) -> None:
    """400 for a tool name (`(name, param)` per tool, in order) that is empty or repeats an
    earlier one. Both real APIs refuse them (OpenAI's names match `^[a-zA-Z0-9_-]{1,64}$`,
    Anthropic's answer "tools: Tool names must be unique."); here a call naming a repeated
    tool could not say whose schema types, and a strict grammar holds, its arguments."""
    seen: dict[str, str] = {}
    for name, where in names:
        if not isinstance(name, str):
            continue
        if not name:
            raise bad_request(f"{where}: a tool name may not be empty", param=where)
        if name in seen:
            raise bad_request(f"tools: Tool names must be unique ({name!r} is both {seen[name]} and {where})",
                              param=where)
        seen[name] = where
