"""Shared pieces of the grammar tests: a battery of schemas, seeded random walks through a
grammar, and an instance generator that writes what the grammar is meant to produce
(declared properties in declared order, nothing extra)."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import jsonschema_rs
from pydantic import BaseModel

from edgemoe.structured import FREE_STRING_BYTES, Grammar

WS = frozenset(b" \t\n\r")
CLOSERS = frozenset(b'"}]')
OPENERS = frozenset(b"{[,")


class Sub(BaseModel):
    x: int
    tags: list[str]


class Mode(BaseModel):
    level: int = 0


def _pydantic_schema() -> dict:
    """What pydantic's model_json_schema() emits: $defs/$ref, anyOf-null, Literal enum/const."""

    class Pick(BaseModel):
        name: str
        age: Optional[int] = None
        items: list[Sub]
        kind: Literal["a", "b"]
        only: Literal["x"] = "x"
        counts: dict[str, int]
        sub: Optional[Sub] = None
        mode: Mode

    return Pick.model_json_schema()


TREE = {
    "$defs": {"Node": {"type": "object", "properties": {
        "v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 3}},
        "required": ["v", "kids"], "additionalProperties": False}},
    "$ref": "#/$defs/Node",
}


@dataclass
class Case:
    """A schema, and how far its instances can be re-serialised and still be accepted."""

    name: str
    schema: Any
    validate: Any = None  # the schema jsonschema_rs checks (default: `schema`)
    ascii_ok: bool = True  # keys/enum strings survive ensure_ascii=True
    spaced_ok: bool = True  # no object/array enum literal (only compact text is allowed)
    indent_ok: bool = True  # shallow enough for indent=2 within the 32-byte gap
    grammar: Optional[Grammar] = field(default=None, repr=False)

    def get(self) -> Grammar:
        if self.grammar is None:
            self.grammar = Grammar.json_object() if self.schema == "json_object" else Grammar.from_schema(self.schema)
        return self.grammar

    def validator(self) -> Any:
        schema = self.validate if self.validate is not None else self.schema
        if schema == "json_object":
            schema = {"type": "object"}
        return jsonschema_rs.validator_for(schema)


CASES = [
    Case("flat", {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "score": {"type": "number"},
        "ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}, "tag": {"type": "string"}},
        "required": ["id", "name"], "additionalProperties": False}),
    Case("nested", {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"first": {"type": "string"},
                 "langs": {"type": "array", "items": {"type": "string"}}}, "required": ["first"]},
        "points": {"type": "array", "items": {"type": "array", "items": {"type": "number"},
                   "minItems": 2, "maxItems": 2}}},
        "required": ["user", "points"]}),
    Case("enums", {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"enum": [1, 12, 1.5, -3, None, True, "x", [1, 2], {"a": 1}]},
        "v": {"const": "fixed"}, "num": {"const": 42}},
        "required": ["color", "n", "v", "num"]}, spaced_ok=False),
    Case("any_of_objects", {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"type": "string"}, "z": {"type": "boolean"}}, "required": ["kind", "z"]}]}),
    Case("tree", TREE),
    Case("string_bounds", {"type": "object", "properties": {
        "code": {"type": "string", "minLength": 2, "maxLength": 4},
        "long": {"type": "string", "minLength": 3}, "short": {"type": "string", "maxLength": 1},
        "empty": {"type": "string", "maxLength": 0}},
        "required": ["code", "long", "short", "empty"]}),
    Case("min_max_items", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}),
    Case("prefix_items", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                          "items": False, "minItems": 1}),
    Case("prefix_false", {"type": "array", "prefixItems": [{"type": "integer"}, False], "items": {"type": "string"}}),
    Case("top_string", {"type": "string"}),
    Case("top_number", {"type": "number"}),
    Case("top_integer", {"type": "integer"}),
    Case("top_boolean", {"type": "boolean"}),
    Case("top_null", {"type": "null"}),
    Case("top_mixed", {"type": ["integer", "string", "null"]}),
    Case("empty", {}),
    Case("true", True),
    Case("json_object", "json_object"),
    Case("pydantic", _pydantic_schema()),
    Case("dict_int", {"type": "object", "additionalProperties": {"type": "integer"}}),
    Case("object_alone", {"type": "object"}),
    Case("all_of", {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string", "maxLength": 3}}, "required": ["b"]}]}),
    Case("nullable", {"type": "object", "properties": {"a": {"type": "string", "nullable": True}},
                      "required": ["a"]},
         validate={"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "required": ["a"]}),
    Case("unicode", {"type": "object", "properties": {
        "café": {"enum": ["thé", "naïve"]}, 'q"k': {"type": "integer"},
        "s": {"type": "string", "minLength": 2, "maxLength": 3}},
        "required": ["café", 'q"k', "s"]}, ascii_ok=False),
    Case("any_of_siblings", {"type": "object", "anyOf": [
        {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}),
    Case("optional_only", {"type": "object", "properties": {
        "p1": {}, "p2": {"type": "integer"}, "p3": {"type": "array", "minItems": 3, "maxItems": 3, "items": False}}}),
    Case("required_extra", {"type": "object", "required": ["k"], "additionalProperties": {"type": "integer"}}),
    Case("linked_list", {"type": "object", "properties": {
        "val": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["val", "next"]}),
    Case("overlap", {"anyOf": [{"type": "integer"}, {"enum": [1, 10, "a", -0.5]}, {"type": "number"},
                               {"type": "string", "maxLength": 2}, {"type": "string"}]}),
    Case("array_union", {"type": "array", "items": {"anyOf": [
        {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        {"type": "array", "items": {"type": "string", "minLength": 1}},
        {"type": "object", "properties": {"k": {"type": "boolean"}}, "additionalProperties": False}]}}),
    Case("ambiguous_nesting", {"anyOf": [
        {"type": "object", "properties": {"child": {"$ref": "#"}, "kind": {"const": "a"}}, "required": ["kind"]},
        {"type": "object", "properties": {"child": {"$ref": "#"}, "kind": {"const": "b"}}, "required": ["kind"]}]}),
    Case("one_of", {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer"},
                              {"type": "array", "items": {"enum": ["p", "q"]}, "maxItems": 2}]}),
]


# --- random walks -------------------------------------------------------------------------

class Rows:
    """Each state's 256 successors, computed once per (interned) state."""

    def __init__(self, grammar: Grammar) -> None:
        self.g = grammar
        self.rows: dict[object, list[object]] = {}

    def row(self, state: object) -> list[object]:
        got = self.rows.get(state)
        if got is None:
            got = self.rows[state] = [self.g.advance(state, b) for b in range(256)]
            self.check(state, got)
        return got

    def check(self, state: object, row: list[object]) -> None:
        """The per-state contract: no dead end, can_continue and free_string exact."""
        g = self.g
        allowed = any(s is not None for s in row)
        assert allowed or g.is_complete(state), "dead end: no byte allowed and not complete"
        assert g.can_continue(state) == allowed
        free = all(row[b] == state for b in FREE_STRING_BYTES)
        assert g.free_string(state) == free
        room = g.string_room(state)
        if room is not None:  # one free byte: taken iff it starts (or is) a character and fits
            for b in FREE_STRING_BYTES:
                assert (row[b] is not None) == (room > 0 and (b < 0x80 or 0xC2 <= b <= 0xF4)), (b, room)


def _pick(allowed: list[int], rng: random.Random, long: bool, uniform: bool) -> int:
    """A random allowed byte: mostly ASCII (or any, uniformly); once the text is long,
    steer toward closing."""
    if long:
        closers = [b for b in allowed if b in CLOSERS]
        if closers and rng.random() < 0.9:
            return rng.choice(closers)
        plain = [b for b in allowed if b not in WS and b not in OPENERS]
        if plain:
            return rng.choice(plain)
        return rng.choice(allowed)
    if uniform:
        return rng.choice(allowed)
    weights = [0.03 if b >= 0x80 else 0.1 if b in WS else 3.0 if b in OPENERS else 1.0 for b in allowed]
    return rng.choices(allowed, weights)[0]


def random_walk(rows: Rows, rng: random.Random, soft: int = 80, hard: int = 6000, uniform: bool = False,
                prefix: bytes = b"") -> bytes:
    """Bytes from start (after `prefix`), each a random allowed one, until a complete value
    and a stop."""
    g = rows.g
    state = g.advance_bytes(g.start(), prefix)
    assert state is not None
    out = bytearray(prefix)
    soft += len(prefix)
    hard += len(prefix)
    while True:
        row = rows.row(state)
        allowed = [b for b in range(256) if row[b] is not None]
        if g.is_complete(state) and (not allowed or rng.random() < (0.6 if len(out) > soft else 0.15)):
            return bytes(out)
        b = _pick(allowed, rng, len(out) > soft, uniform)
        out.append(b)
        state = row[b]  # type: ignore[assignment]
        assert len(out) < hard, f"walk did not end: {bytes(out[:200])!r}..."


# --- instances ------------------------------------------------------------------------------

ALPHABET = "abcXYZ 019_-\"\\/\n\t\x01\x7féß中😀"


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        node = node[part]
    return node


def _merge(parts: list[dict]) -> dict:
    """Shallow allOf merge for the battery's simple cases."""
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            if k == "properties":
                out[k] = {**out.get(k, {}), **v}
            elif k == "required":
                out[k] = [*out.get(k, []), *v]
            else:
                out.setdefault(k, v)
    return out


def instance(schema: Any, rng: random.Random, root: Any, depth: int = 0) -> Any:
    """A valid instance in the form the grammar writes: declared order, no extra keys."""
    if schema == "json_object":
        return {f"k{i}": any_value(rng, 2) for i in range(rng.randint(0, 3))}
    if schema is True or schema == {} or (isinstance(schema, dict) and set(schema) <= {"title", "description"}):
        return any_value(rng, 2)
    if "$ref" in schema:
        return instance(_resolve(root, schema["$ref"]), rng, root, depth)
    if "allOf" in schema:
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return instance(_merge([rest, *schema["allOf"]]), rng, root, depth)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            rest = {k: v for k, v in schema.items() if k not in (key, "title", "default", "description")}
            alts = schema[key] if depth < 6 else [a for a in schema[key] if "$ref" not in a] or schema[key]
            return instance(_merge([rest, rng.choice(alts)]) if rest else rng.choice(alts), rng, root, depth)
    if "const" in schema:
        return copy.deepcopy(schema["const"])
    if "enum" in schema:
        return copy.deepcopy(rng.choice(schema["enum"]))
    types = schema.get("type", "object" if "properties" in schema or "required" in schema else None)
    types = [types] if isinstance(types, str) else list(types or ["object"])
    if schema.get("nullable"):
        types.append("null")
    return _typed(schema, rng.choice(types), rng, root, depth)


def _typed(schema: dict, kind: str, rng: random.Random, root: Any, depth: int) -> Any:
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "integer":
        return rng.choice([0, -1, 7, rng.randrange(-10**19, 10**19)])
    if kind == "number":
        return rng.choice([0, -2.5, 1e-7, 6.02e23, rng.uniform(-1e6, 1e6), rng.randrange(-10**6, 10**6)])
    if kind == "string":
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 6)
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, max(lo, hi))))
    if kind == "array":
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        hi = schema.get("maxItems", schema.get("minItems", 0) + 3)
        if items is False:
            hi = min(hi, len(prefix))
        if False in prefix:
            hi = min(hi, prefix.index(False))
        if depth > 5:
            hi = schema.get("minItems", 0)
        n = rng.randint(schema.get("minItems", 0), hi)
        return [instance(prefix[i] if i < len(prefix) else items, rng, root, depth + 1) for i in range(n)]
    props = schema.get("properties", {})
    required = schema.get("required", [])
    if not props:
        more = schema.get("additionalProperties", True)
        if more is False:
            return {}
        keys = required or [f"k{i}" for i in range(rng.randint(0, 2))]
        return {k: instance(more, rng, root, depth + 1) for k in dict.fromkeys(keys)}
    out = {}
    for name, sub in props.items():
        if name in required or (rng.random() < 0.5 and not (isinstance(sub, dict) and sub.get("items") is False)):
            out[name] = instance(sub, rng, root, depth + 1)
    return out


def any_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randrange(-1000, 1000)
    if kind == 3:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 4)))
    if kind == 4:
        return rng.uniform(-100, 100)
    if kind == 5:
        return [any_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": any_value(rng, depth - 1) for i in range(rng.randint(0, 3))}


def layouts(case: Case, value: Any) -> list[str]:
    """The serialisations of `value` the grammar must accept for this case."""
    out = [json.dumps(value, ensure_ascii=False, separators=(",", ":"))]
    if case.spaced_ok:
        out.append(json.dumps(value, ensure_ascii=False))
        if case.ascii_ok:
            out.append(json.dumps(value))
        if case.indent_ok:
            out.append(json.dumps(value, indent=2, ensure_ascii=case.ascii_ok))
    return out
