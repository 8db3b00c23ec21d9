"""A request's function tools as the routes hold them, whichever protocol sent them
(its own module: the forced call, the output formats and the strict calls all read it,
and the request type imports the output formats)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def tool_functions(tools: list[dict[str, Any]] | None) -> list[Mapping[str, Any]]:
    """Each function tool's definition that has a name (`{"type": "function", "function":
    {...}}` as the routes give them, or the definition itself)."""
    out = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        if isinstance(function.get("name"), str):
            out.append(function)
    return out
