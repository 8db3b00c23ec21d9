"""Schema-driven typing of raw parameter text, one row per rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgemoe.tool_values import (
    convert_value,
    property_schema,
    tool_schemas,
    value_type,
)

DEFS = {
    "$defs": {
        "Mode": {"type": "string", "enum": ["fast", "slow"]},
        "Count": {"type": "integer"},
        "Point": {"type": "object", "properties": {"x": {"type": "number"}}},
        "Loop": {"$ref": "#/$defs/Loop"},
    },
    "definitions": {"Flag": {"type": "boolean"}},
}

# (rule, schema, raw text, expected value) — compared by JSON text, so 1 != 1.0 != true.
ROWS: list[tuple[str, dict[str, Any] | None, str, Any]] = [
    ("string kept raw", {"type": "string"}, " 42 \n", " 42 \n"),
    ("string 'null' stays a string", {"type": "string"}, "null", "null"),
    ("string enum kept raw", {"type": "string", "enum": ["1", "2"]}, "1", "1"),
    ("integer", {"type": "integer"}, " -17 ", -17),
    ("integer written whole as float", {"type": "integer"}, "5.0", 5),
    ("integer rejects a fraction: JSON", {"type": "integer"}, "5.5", 5.5),
    ("integer rejects words: raw", {"type": "integer"}, "five", "five"),
    ("number fractional", {"type": "number"}, "2.5", 2.5),
    ("number whole is int", {"type": "number"}, "3.0", 3),
    ("number exponent", {"type": "number"}, "1e3", 1000),
    ("number big int exact", {"type": "number"}, "12345678901234567890", 12345678901234567890),
    ("number NaN is not JSON", {"type": "number"}, "nan", "nan"),
    ("boolean any case", {"type": "boolean"}, "True", True),
    ("boolean false", {"type": "boolean"}, "FALSE", False),
    ("boolean other: raw", {"type": "boolean"}, "yes", "yes"),
    ("object JSON", {"type": "object"}, '{"a": [1, null]}', {"a": [1, None]}),
    ("object Python literal", {"type": "object"}, "{'a': True, 'b': None}", {"a": True, "b": None}),
    ("array JSON", {"type": "array"}, '[1, "x"]', [1, "x"]),
    ("array Python tuple", {"type": "array"}, "(1, 'x')", [1, "x"]),
    ("array unparseable: raw", {"type": "array"}, "[1, 2", "[1, 2"),
    ("object set literal: raw", {"type": "object"}, "{1, 2}", "{1, 2}"),
    ("null for a typed value", {"type": "integer"}, "null", None),
    ("null any case", {"type": "object"}, "NULL", None),
    ("Python's None for a typed value (Qwen3-Coder's template: str)", {"type": ["integer", "null"]}, "None", None),
    ("None for a string stays a string", {"anyOf": [{"type": "string"}, {"type": "null"}]}, "None", "None"),
    ("no schema: JSON", None, '{"k": 1}', {"k": 1}),
    ("no schema: number", None, "7", 7),
    ("no schema: raw text", None, "hello there", "hello there"),
    ("no schema: null", None, "null", None),
    ("untyped schema: JSON", {"description": "anything"}, "true", True),
    ("$ref into $defs", {"$ref": "#/$defs/Count"}, "9", 9),
    ("$ref into definitions", {"$ref": "#/definitions/Flag"}, "true", True),
    ("$ref to a string enum", {"$ref": "#/$defs/Mode"}, "fast", "fast"),
    ("$ref cycle ends", {"$ref": "#/$defs/Loop"}, "3", 3),
    ("allOf merged", {"allOf": [{"$ref": "#/$defs/Point"}, {"description": "p"}]},
     '{"x": 1}', {"x": 1}),
    ("anyOf nullable integer", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "4", 4),
    ("anyOf nullable null", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "null", None),
    ("oneOf ref or null", {"oneOf": [{"$ref": "#/$defs/Count"}, {"type": "null"}]}, "8", 8),
    ("nullable string null", {"anyOf": [{"type": "string"}, {"type": "null"}]}, "null", None),
    ("nullable string text", {"anyOf": [{"type": "string"}, {"type": "null"}]}, "12", "12"),
    ("type array with null", {"type": ["integer", "null"]}, "10", 10),
    ("type array null", {"type": ["string", "null"]}, "null", None),
    ("nullable: true", {"type": "string", "nullable": True}, "null", None),
    ("union prefers non-string", {"type": ["string", "integer"]}, "12", 12),
    ("union falls back to string", {"type": ["integer", "string"]}, "twelve", "twelve"),
    ("untyped enum string member", {"enum": ["1", "2"]}, "1", "1"),
    ("untyped enum integer member", {"enum": [1, 2]}, "1", 1),
    ("untyped enum mixed", {"enum": ["1", 2, True]}, "2", 2),
    ("untyped enum bool is not int", {"enum": [1, True]}, "true", True),
    ("untyped const string", {"const": "1"}, "1", "1"),
    ("untyped const integer", {"const": 1}, "1", 1),
    ("untyped enum no match: JSON", {"enum": ["a"]}, "3", 3),
    ("anyOf of consts", {"anyOf": [{"const": "0"}, {"const": 1}]}, "0", "0"),
]


@pytest.mark.parametrize(("schema", "raw", "expected"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_convert_value(schema: dict[str, Any] | None, raw: str, expected: Any) -> None:
    got = convert_value(raw, schema, DEFS if schema is not None else None)
    assert json.dumps(got) == json.dumps(expected)


def test_value_type_nullable_forms_agree() -> None:
    forms = [
        {"type": ["integer", "null"]},
        {"type": "integer", "nullable": True},
        {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/Count"}]},
    ]
    nullable_int = value_type({"type": "integer", "nullable": True}, DEFS)
    assert {value_type(f, DEFS) for f in forms} == {nullable_int}


def test_property_schema_through_ref_and_allof() -> None:
    root = {
        "$defs": {"Base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {"type": "string"}}}],
    }
    assert property_schema(root, "a") == {"type": "integer"}
    assert property_schema(root, "b") == {"type": "string"}
    assert property_schema(root, "c") is None
    assert property_schema(None, "a") is None


def test_tool_schemas_accepts_all_tool_shapes() -> None:
    params = {"type": "object", "properties": {}}
    tools = [
        {"type": "function", "function": {"name": "openai", "parameters": params}},
        {"type": "function", "name": "responses", "parameters": params},
        {"name": "anthropic", "input_schema": params},
        {"type": "web_search"},  # Codex sends such tools: skipped, not an error
    ]
    assert tool_schemas(tools) == {"openai": params, "responses": params, "anthropic": params}
