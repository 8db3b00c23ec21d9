"""A Hermes call's schema: each tool's parameters moved under $defs with their refs
rebased must mean what they meant alone (checked by an independent validator), and the
grammar accepts exactly the calls to a tool with valid arguments."""

from __future__ import annotations

import json
import random

import jsonschema_rs
import pytest
from grammar_support import CASES, instance

from edgemoe.structured import Grammar
from edgemoe.structured.call_schema import call_schema, rebase_refs

# Tools' parameters: objects, with the refs a generator writes ($defs, draft 7's
# definitions, "#" recursion) and data that looks like a ref but isn't one.
OBJECT_CASES = [c for c in CASES if isinstance(c.schema, dict) and c.schema.get("type") == "object"]
REFS = {
    "type": "object",
    "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                        "required": ["x", "y"], "additionalProperties": False}},
    "definitions": {"Tag": {"enum": ["a", "b"]}},
    "properties": {
        "at": {"$ref": "#/$defs/Point"},
        "path": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "maxItems": 3},
        "tag": {"$ref": "#/definitions/Tag"},
        "child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        "literal": {"const": {"$ref": "#/$defs/Point"}},
        "$ref": {"type": "string", "maxLength": 3},
    },
    "required": ["at", "tag", "child"],
    "additionalProperties": False,
}


def test_refs_are_rebased_and_data_is_not() -> None:
    out = rebase_refs(REFS, "#/$defs/tool3")
    assert out["properties"]["at"] == {"$ref": "#/$defs/tool3/$defs/Point"}  # type: ignore[index]
    assert out["properties"]["path"]["items"] == {"$ref": "#/$defs/tool3/$defs/Point"}  # type: ignore[index]
    assert out["properties"]["tag"] == {"$ref": "#/$defs/tool3/definitions/Tag"}  # type: ignore[index]
    assert out["properties"]["child"]["anyOf"][0] == {"$ref": "#/$defs/tool3"}  # type: ignore[index]
    assert out["properties"]["literal"] == {"const": {"$ref": "#/$defs/Point"}}  # type: ignore[index]
    assert out["properties"]["$ref"] == {"type": "string", "maxLength": 3}  # type: ignore[index]
    assert rebase_refs([{"$ref": "#"}, True], "#/x") == [{"$ref": "#/x"}, True]  # draft 4 tuple items


def call(name: str, arguments: object) -> dict:
    return {"name": name, "arguments": arguments}


@pytest.mark.parametrize("seed", range(3))
def test_a_call_is_valid_exactly_where_its_arguments_are(seed: int) -> None:
    """jsonschema_rs on the combined schema against jsonschema_rs on each tool's own."""
    rng = random.Random(seed)
    tools = [(f"t{i}", c.schema) for i, c in enumerate(OBJECT_CASES)] + [("refs", REFS), ("free", None)]
    combined = jsonschema_rs.validator_for(call_schema(tools))
    for name, params in tools:
        own = jsonschema_rs.validator_for(params if params is not None else {"type": "object"})
        root = params if params is not None else "json_object"
        samples = [instance(root, rng, root) for _ in range(4)]
        samples += [{"at": {"x": 1}}, {"x": 1}, {}, [], "s", {"tag": "c", "at": {"x": 1, "y": 2}, "child": None}]
        for args in samples:
            assert combined.is_valid(call(name, args)) == own.is_valid(args), (name, args)
        assert not combined.is_valid(call(name + "_", samples[0]))


def test_the_grammar_takes_calls_in_the_templates_layout() -> None:
    """Qwen's template writes `{"name": …, "arguments": …}` with json.dumps' separators (an
    object const must be written compactly: `literal` left out)."""
    refs = {**REFS, "properties": {k: v for k, v in REFS["properties"].items() if k != "literal"}}
    tools = [("set", OBJECT_CASES[0].schema), ("refs", refs), ("free", None)]
    grammar = Grammar.from_schema(call_schema(tools))
    rng = random.Random(0)
    for name, params in tools:
        root = params if params is not None else "json_object"
        for _ in range(5):
            text = json.dumps(call(name, instance(root, rng, root)), ensure_ascii=False)
            state = grammar.advance_bytes(grammar.start(), text.encode())
            assert state is not None and grammar.is_complete(state), text
    for bad in ('{"name": "other", "arguments": {}}', '{"arguments": {}, "name": "free"}',
                '{"name": "free", "arguments": []}', '{"name": "free"}'):
        state = grammar.advance_bytes(grammar.start(), bad.encode())
        assert state is None or not grammar.is_complete(state), bad
