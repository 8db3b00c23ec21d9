"""A Hermes tool call's JSON as one JSON Schema, for the grammar to constrain calls by.

Inside `<tool_call>` … `</tool_call>` a Hermes model writes `{"name": NAME, "arguments":
ARGS}`. The call's schema is an anyOf with one object per tool: `name` that tool's name
(a const), `arguments` its parameters schema (an object), in that order (the template's).
Each tool's parameters go under `$defs` with their local `$ref`s ("#", "#/...") rebased
there, so they resolve in the combined document as they did in the tool's own, and
without their annotations (descriptions are most of a tool set's bytes; the grammar
ignores them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgemoe.structured.keywords import ANNOTATIONS

# Keywords whose value is a map of schemas, a list of schemas, or one schema (the places a
# $ref can be a reference; `enum`, `const`, `default`, `examples` hold data, left alone).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMAS = ("items", "additionalItems", "additionalProperties", "not", "contains", "propertyNames",
            "if", "then", "else", "unevaluatedItems", "unevaluatedProperties")
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def call_schema(tools: Sequence[tuple[str, object | None]]) -> dict[str, Any]:
    """The schema of one call to any of `tools`: (name, parameters schema; None for any
    JSON object)."""
    defs: dict[str, Any] = {}
    alternatives = []
    for i, (name, parameters) in enumerate(tools):
        if parameters is None:
            arguments: object = ANY_OBJECT
        else:
            key = f"tool{i}"
            defs[key] = rebase_refs(parameters, f"#/$defs/{key}", drop=ANNOTATIONS)
            arguments = {"type": "object", "$ref": f"#/$defs/{key}"}  # the parser reads an object
        alternatives.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    return {"anyOf": alternatives, "$defs": defs} if defs else {"anyOf": alternatives}


def rebase_refs(schema: object, base: str, drop: frozenset[str] = frozenset()) -> object:
    """`schema` with each local $ref pointing under `base` ("#" → base, "#/a" → base + "/a"),
    and without the keywords in `drop` (in schemas only: a property may be named "title")."""
    if isinstance(schema, list):  # `items` as a list (draft 4 tuples)
        return [rebase_refs(s, base, drop) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in drop:
            continue
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = base + value[1:]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: rebase_refs(s, base, drop) for name, s in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list) or key in _SCHEMAS:
            out[key] = rebase_refs(value, base, drop)
        else:
            out[key] = value
    return out
