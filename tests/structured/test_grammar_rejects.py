"""What the JSON-Schema byte grammar refuses (bytes, at the byte that breaks the rule) and
which schemas it refuses to compile (GrammarError naming the path)."""

from __future__ import annotations

import time

import pytest

from edgemoe.structured import Grammar, GrammarError

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
       "required": ["a"], "additionalProperties": False}


def refused_at(g: Grammar, text: bytes) -> int | None:
    """Index of the first refused byte; len(text) if all are taken but the value is not
    complete; None if the whole text is accepted as a complete value."""
    state = g.start()
    for i, b in enumerate(text):
        state = g.advance(state, b)
        if state is None:
            return i
    return None if g.is_complete(state) else len(text)


REFUSED = [
    # wrong types
    ({"type": "integer"}, b'"1"', 0),
    ({"type": "integer"}, b"1.5", 1),
    ({"type": "integer"}, b"1e5", 1),
    ({"type": "integer"}, b"true", 0),
    ({"type": "string"}, b"12", 0),
    ({"type": "boolean"}, b"nul", 0),
    ({"type": "null"}, b"nulL", 3),
    ({"type": "array"}, b"{}", 0),
    (OBJ, b'{"a":"x"}', 5),
    (OBJ, b'{"a":1,"b":2}', 11),
    # required, extra, order (declared order only, even where the schema would allow it)
    (OBJ, b'{"b":"x"}', 2),
    (OBJ, b"{}", 1),
    (OBJ, b'{"a":1,"c":2}', 8),
    (OBJ, b'{"a":1,"a":2}', 8),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
     b'{"b":1,"a":2}', 6),
    ({"type": "object", "properties": {"name": {"type": "string"}}}, b'{"nam":"x"}', 5),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, b'{"a":1,}', 6),
    # strings: escapes, raw control bytes, surrogates
    ({"type": "string"}, b'"\\x"', 2),
    ({"type": "string"}, b'"\\u12G4"', 5),
    ({"type": "string"}, b'"\\U1234"', 2),
    ({"type": "string"}, b'"\\ud800"', 7),
    ({"type": "string"}, b'"\\ud800\\u0041"', 9),
    ({"type": "string"}, b'"\\udc00"', 4),
    ({"type": "string"}, b'"a\nb"', 2),
    ({"type": "string"}, b'"\x00"', 1),
    ({"type": "string"}, b'"\x1f"', 1),
    ({"type": "string"}, b'"abc', 4),
    # numbers
    ({"type": "number"}, b"01", 1),
    ({"type": "number"}, b"-01", 2),
    ({"type": "number"}, b"00", 1),
    ({"type": "number"}, b"+1", 0),
    ({"type": "number"}, b".5", 0),
    ({"type": "number"}, b"1.", 2),
    ({"type": "number"}, b"1.e5", 2),
    ({"type": "number"}, b"1e", 2),
    ({"type": "number"}, b"1e+", 3),
    ({"type": "number"}, b"-", 1),
    ({"type": "number"}, b"1" * 21, 20),
    ({"type": "number"}, b"0." + b"1" * 21, 22),
    ({"type": "number"}, b"1e100", 4),
    ({"type": "number"}, b"NaN", 0),
    ({"type": "number"}, b"Infinity", 0),
    # arrays
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, b"[1,2,3]", 4),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, b"[1]", 2),
    ({"type": "array", "items": {"type": "integer"}}, b"[1,]", 3),
    ({"type": "array", "items": {"type": "integer"}}, b"[,1]", 1),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": False}, b'["a",1]', 4),
    # literals: only the canonical compact text
    ({"enum": ["a", "b"]}, b'"c"', 1),
    ({"enum": ["a"]}, b'"\\u0061"', 1),
    ({"enum": [[1, 2]]}, b"[1, 2]", 3),
    ({"const": {"a": 1}}, b'{"a": 1}', 5),
    ({"enum": [1, 12]}, b"123", 2),
    ({"enum": [1.0]}, b"1", 1),
    # string lengths (code points: an escape or a UTF-8 sequence counts one)
    ({"type": "string", "maxLength": 1}, "\"é\"".encode(), None),
    ({"type": "string", "maxLength": 1}, "\"éa\"".encode(), 3),
    ({"type": "string", "maxLength": 1}, b'"\\n"', None),
    ({"type": "string", "maxLength": 1}, b'"\\ud83d\\ude00"', None),
    ({"type": "string", "maxLength": 1}, b'"\\na"', 3),
    ({"type": "string", "minLength": 2}, b'"a"', 2),
    ({"type": "string", "minLength": 2}, "\"é\"".encode(), 3),
    ({"type": "string", "maxLength": 4}, b'"\xc0\x80"', 1),
    ({"type": "string", "maxLength": 4}, b'"\x80"', 1),
    ({"type": "string", "maxLength": 4}, b'"\xff"', 1),
    ({"type": "string", "maxLength": 4}, b'"\xed\xa0\x80"', 2),
    ({"type": "string", "maxLength": 4}, b'"\xe2\x82"', 3),
    ({"type": "string"}, b'"\xff\x80\xc0"', None),  # free strings take any byte >= 0x80
    # trailing garbage, whitespace at the start and after the end
    ({"type": "object"}, b"{}x", 2),
    ({"type": "object"}, b"{} ", 2),
    ({"type": "integer"}, b"1 ", 1),
    ({"type": "string"}, b'"a"b', 3),
    ({"type": "boolean"}, b"truex", 4),
    ({"type": "object"}, b" {}", 0),
    ({"type": "object"}, b"\n{}", 0),
    # whitespace gaps: 32 bytes at most
    ({"type": "object"}, b"{" + b" " * 32 + b"}", None),
    ({"type": "object"}, b"{" + b" " * 33 + b"}", 33),
    (OBJ, b'{"a"' + b"\n" * 32 + b":" + b"\t" * 32 + b"1" + b" " * 32 + b"}", None),
    (OBJ, b'{"a":1' + b" " * 33, 6 + 32),
    # json_object and any-value nesting
    ("json_object", b"[]", 0),
    ("json_object", b"1", 0),
    ("json_object", b'"a"', 0),
    ({}, b"[" * 128 + b"]" * 128, None),
    ({}, b"[" * 129, 128),
    ({"$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}}}, "$ref": "#/$defs/t"},
     b'{"k":' * 128 + b"{}", 127 * 5 + 1),
]


@pytest.mark.parametrize("schema,text,at", REFUSED)
def test_refused_at(schema: object, text: bytes, at: int | None) -> None:
    g = Grammar.json_object() if schema == "json_object" else Grammar.from_schema(schema)
    assert refused_at(g, text) == at


def test_object_property_order_is_declared_order() -> None:
    """The grammar writes declared order only (documented): a reordered object is refused
    even though it is valid JSON Schema instance text."""
    g = Grammar.from_schema({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"]})
    assert refused_at(g, b'{"a":1,"b":2}') is None
    assert refused_at(g, b'{"b":2,"a":1}') == 2


ERRORS = [
    (False, ""),
    (5, ""),
    ({"not": {}}, ""),
    ({"properties": {"a": {"not": {"type": "string"}}}}, "properties.a"),
    ({"if": {}, "then": {}}, ""),
    ({"patternProperties": {"x": {}}}, ""),
    ({"dependentSchemas": {}}, ""),
    ({"dependentRequired": {}}, ""),
    ({"type": "array", "contains": {}}, ""),
    ({"unevaluatedProperties": False}, ""),
    ({"propertyNames": {"maxLength": 3}}, ""),
    ({"additionalItems": False}, ""),
    ({"whatever": 1}, ""),
    ({"type": "foo"}, "type"),
    ({"type": []}, "type"),
    ({"properties": {"items": {"type": "array", "items": {"type": "strin"}}}}, "properties.items.items.type"),
    ({"$ref": "#/$defs/missing"}, "$ref"),
    ({"properties": {"a": {"$ref": "#/nope"}}}, "properties.a.$ref"),
    ({"$ref": "other.json#/x"}, "$ref"),
    ({"properties": {"a": 5}}, "properties.a"),
    ({"properties": {"a": {"type": "string"}}, "required": ["a"], "anyOf": [False]}, ""),
    ({"properties": {"a": False}, "required": ["a"]}, "properties.a"),
    ({"enum": []}, "enum"),
    ({"enum": "ab"}, "enum"),
    ({"enum": [float("nan")]}, "enum"),
    ({"enum": list(range(1001))}, "enum"),
    ({"type": "string", "enum": [1, 2]}, "enum"),
    ({"const": 1, "enum": [2, 3]}, "const"),
    ({"type": "string", "const": 1}, "const"),
    ({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, ""),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": False}, "required"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems"),
    ({"type": "array", "minItems": -1}, "minItems"),
    ({"type": "array", "maxItems": "3"}, "maxItems"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength"),
    ({"type": "array", "items": [{"type": "string"}]}, "items"),
    ({"type": "array", "minItems": 3, "maxItems": 3, "items": False}, "minItems"),
    ({"type": "object", "properties": {"a": {"type": "array", "minItems": 1, "items": False}}, "required": ["a"]},
     "properties.a.minItems"),
    ({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, "properties.next"),
    ({"$ref": "#"}, ""),
    ({"allOf": [{"const": 1}, {"const": 2}]}, ""),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, ""),
    ({"allOf": [{"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                {"properties": {"b": {}}}]}, ""),
    ({"anyOf": [{}], "oneOf": [{}]}, ""),
    ({"anyOf": []}, "anyOf"),
    ({"properties": {"x": {"allOf": [{"$ref": "#/properties/x"}]}}}, "properties.x"),
]


@pytest.mark.parametrize("schema,path", ERRORS, ids=lambda v: repr(v)[:40])
def test_grammar_errors_name_the_path(schema: object, path: str) -> None:
    with pytest.raises(GrammarError) as info:
        Grammar.from_schema(schema)
    assert info.value.path == path
    assert str(info.value).startswith(f"schema at {path or 'the root'}: ")
    assert isinstance(info.value, ValueError)


def test_hostile_schemas_are_bounded() -> None:
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match="5000 subschemas"):
        Grammar.from_schema({"anyOf": [{"type": "string", "maxLength": i} for i in range(6000)]})
    deep: dict = {"type": "string"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError, match="64 deep") as info:
        Grammar.from_schema(deep)
    assert info.value.path.startswith("items.items.")
    chain = {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "null"}]} for i in range(1500)}}
    chain["$defs"]["d1500"] = {"$ref": "#/$defs/d0"}
    chain["$ref"] = "#/$defs/d0"
    g = Grammar.from_schema(chain)  # a long $ref cycle: compiles, allows null
    assert refused_at(g, b"null") is None
    mutual = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}},
                        "b": {"type": "array", "items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}
    g = Grammar.from_schema(mutual)
    assert refused_at(g, b'{"b":[{"b":[{}]},{}]}') is None
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}
    g = Grammar.from_schema(wide)
    assert refused_at(g, b'{"p7":1,"p2999":2}') is None
    assert refused_at(g, b'{"p7":1,"p3":2}') == 11  # p3 could still be p30..
    fan = {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"},
                                         {"type": "object", "properties": {"p": {"const": i}}}]} for i in range(600)}}
    fan["$defs"]["d600"] = {"type": "null"}
    fan["$ref"] = "#/$defs/d0"
    with pytest.raises(GrammarError, match="100000"):
        Grammar.from_schema(fan)  # 600 nested anyOf: each expands all below it
    assert time.perf_counter() - t0 < 30  # generous: only a hang would fail


def test_unsatisfiable_parts_are_pruned() -> None:
    """Optional parts that no finite value satisfies are dropped, so no state is a dead end."""
    g = Grammar.from_schema({"type": "object", "properties": {
        "a": {"type": "array", "minItems": 3, "maxItems": 3, "items": False},
        "b": False, "c": {"type": "integer"}}})
    assert refused_at(g, b"{}") is None
    assert refused_at(g, b'{"c":1}') is None
    assert refused_at(g, b'{"a"') == 2
    g = Grammar.from_schema({"anyOf": [{"type": "array", "prefixItems": [False]}, {"type": "string"}]})
    assert refused_at(g, b"[]") is None
    assert refused_at(g, b"[1") == 1
    g = Grammar.from_schema({"type": "object", "properties": {"t": {"$ref": "#"}}})  # optional recursion
    assert refused_at(g, b'{"t":{"t":{}}}') is None


def test_accepted_but_unenforced_keywords_compile() -> None:
    schema = {"type": "object", "title": "T", "description": "d", "$schema": "x", "$id": "y",
              "$comment": "c", "deprecated": False, "readOnly": False, "writeOnly": False, "strict": True,
              "discriminator": {"propertyName": "k"}, "examples": [{}], "default": {},
              "minProperties": 1, "maxProperties": 3,
              "properties": {"s": {"type": "string", "format": "date", "pattern": "^x", "contentEncoding": "base64",
                                   "contentMediaType": "text/plain"},
                             "n": {"type": "number", "minimum": 0, "maximum": 9, "exclusiveMinimum": 0,
                                   "exclusiveMaximum": 10},
                             "u": {"type": "array", "uniqueItems": True}}}
    g = Grammar.from_schema(schema)
    assert refused_at(g, b'{"s":"xyz","n":5,"u":[1,1]}') is None  # uniqueItems not enforced
    assert refused_at(g, b'{"s":"xyz","n":-5,"u":[1,1]}') == 15  # the bounds are (test_ranged_number.py)
    assert refused_at(g, b'{"s":"anything"}') == 6  # so is the pattern (test_pattern_string.py)


def test_nullable_and_one_of_and_merges() -> None:
    g = Grammar.from_schema({"type": "integer", "nullable": True})
    assert refused_at(g, b"null") is None and refused_at(g, b"3") is None
    g = Grammar.from_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})  # generated as anyOf
    assert refused_at(g, b"3") is None
    g = Grammar.from_schema({"$defs": {"P": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                             "$ref": "#/$defs/P", "required": ["a"]})  # $ref with a constraining sibling
    assert refused_at(g, b"{}") == 1 and refused_at(g, b'{"a":1}') is None
    g = Grammar.from_schema({"allOf": [{"type": ["string", "integer"]}, {"type": "number"}]})
    assert refused_at(g, b"3") is None and refused_at(g, b'"a"') == 0 and refused_at(g, b"3.5") == 1
    g = Grammar.from_schema({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k", "z"]})
    assert refused_at(g, b'{"k":1,"z":[true]}') is None  # an undeclared required name: any value
    g = Grammar.from_schema({"enum": ["a", 1, None], "type": ["string", "null"]})
    assert refused_at(g, b"1") == 0 and refused_at(g, b"null") is None
    # nullable next to $ref / allOf / anyOf: null, or the rest
    g = Grammar.from_schema({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N", "nullable": True}}}},
                             "$ref": "#/$defs/N"})
    assert refused_at(g, b'{"next":{"next":null}}') is None and refused_at(g, b"null") == 0
    g = Grammar.from_schema({"allOf": [{"type": "string", "nullable": True}, {"maxLength": 3}]})
    assert refused_at(g, b"null") is None and refused_at(g, b'"abcd"') == 4
    g = Grammar.from_schema({"allOf": [{"type": "string", "nullable": True}, {"type": "string"}]})
    assert refused_at(g, b"null") == 0


def test_unsatisfiable_alternatives_are_pruned_not_raised() -> None:
    """anyOf siblings merged into each alternative: one that cannot meet them drops out;
    recursion through merged schemas closes a cycle (no unrolling to the depth limit)."""
    g = Grammar.from_schema({"type": "object", "anyOf": [{"$ref": "#"}, {"type": "null"},
                                                         {"properties": {"a": {"type": "integer"}}}]})
    assert refused_at(g, b'{"a":1}') is None and refused_at(g, b"null") == 0
    g = Grammar.from_schema({"anyOf": [{"type": "string", "enum": [1]}, {"type": "integer"}]})
    assert refused_at(g, b"1") is None
    g = Grammar.from_schema({"$defs": {"T": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/T", "required": ["name"]}}, "name": {"type": "string"}}}},
        "$ref": "#/$defs/T"})
    assert refused_at(g, b'{"kids":[{"kids":[{"name":"x"}],"name":"y"}]}') is None
    assert refused_at(g, b'{"kids":[{}]}') == 10
