"""Typing raw parameter text by the tool's JSON schema (Qwen3-Coder XML values).

The model writes every value as raw text; the schema says what it means. Rules:

- the effective schema follows ``$ref`` (``#/$defs/…``, ``#/definitions/…``), merges
  ``allOf`` (memoised and bounded in total work: ``SchemaResolver``), and takes ``anyOf``/``oneOf`` as the union of its non-null branches
  (a ``null`` branch, ``"type": [..., "null"]`` or ``nullable: true`` make it nullable);
- ``string`` keeps the text as written; ``integer`` → int; ``number`` → int when
  whole, else float; ``boolean`` → true/false in any case; ``object``/``array`` →
  JSON, then a Python literal (``ast.literal_eval``: single quotes, True/None);
- ``null`` (any case) → None, unless the type is a non-nullable string; ``None`` (Python's
  str of it, as Qwen3-Coder's template writes a null) → None where no string is possible;
- an ``enum``/``const`` without ``type`` keeps its members' own types: text equal to
  the string member ``"1"`` stays ``"1"``, text ``1`` matching the integer member is 1;
- no schema, an unknown parameter, or text its type rejects: JSON if it parses,
  else the raw string.

Results are always JSON-serialisable (no NaN/Infinity, no sets, no bytes).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Work one tool's schema may cost (nodes visited + keys copied); past it, untyped text.
MAX_SCHEMA_WORK = 20_000
_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_FAIL = object()  # a converter's "not this type"
# Tried in this order when a value may have several types; string always fits: last.
_ORDER = ("boolean", "integer", "number", "object", "array", "string")


@dataclass(frozen=True)
class ValueType:
    """What a schema allows for a value, as far as converting text is concerned."""

    types: tuple[str, ...] = ()  # JSON-schema type names, "null" excluded; () = any
    nullable: bool = False
    enum: tuple[Any, ...] | None = None  # enum/const members when listed


def tool_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Function name → parameters schema, from OpenAI, Responses or Anthropic tools."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters", fn.get("input_schema"))
        out[fn["name"]] = params if isinstance(params, Mapping) else {}
    return out


class SchemaResolver:
    """One tool's parameters schema, resolved on demand: memoised and bounded in total work.

    NOTE: ``$ref``/``allOf`` graphs branch: ``allOf: [{$ref: a}] × 3`` with ``a`` the same
    again, a few levels deep, is exponential to expand naively (a 200-byte schema ran
    past 120 s). Each schema node is resolved once here (results keyed by the node,
    which is kept alive so its id stays unique), a node met again while it is being
    resolved is a cycle and contributes nothing, and after ``budget`` units of work
    (nodes visited plus keys copied) everything left resolves to ``{}`` (untyped text).
    """

    def __init__(self, root: Mapping[str, Any] | None, budget: int = MAX_SCHEMA_WORK) -> None:
        self.root: Mapping[str, Any] = root if isinstance(root, Mapping) else {}
        self._budget = budget
        self._resolved: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        self._types: dict[int, tuple[Mapping[str, Any], ValueType]] = {}
        self._active: set[int] = set()  # nodes being resolved (a cycle meets one again)
        self._typing: set[int] = set()  # nodes being typed
        self._properties: dict[str, ValueType] = {}

    @property
    def exhausted(self) -> bool:
        return self._budget <= 0

    def _spend(self, units: int) -> bool:
        self._budget -= units
        return self._budget > 0

    def resolve(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """The schema with ``$ref`` followed and ``allOf`` merged in (later wins per key)."""
        key = id(schema)
        if key not in self._resolved and key not in self._active and not self._spend(1 + len(schema)):
            return {}
        return self._once(schema, self._resolved, self._active, self._merge, {})

    def _merge(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        ref = schema.get("$ref")
        if isinstance(ref, str):
            out.update(self.resolve(lookup_ref(ref, self.root)))
        parts = schema.get("allOf")
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, Mapping):
                merged = self.resolve(part)
                props = {**_props(out), **_props(merged)}
                if not self._spend(len(merged) + len(props)):
                    break
                out.update(merged)
                if props:
                    out["properties"] = props
        out.update({k: v for k, v in schema.items() if k not in ("$ref", "allOf")})
        return out

    def property_schema(self, name: str) -> Mapping[str, Any] | None:
        """The schema of parameter ``name``, None if not declared."""
        props = self.resolve(self.root).get("properties")
        prop = props.get(name) if isinstance(props, Mapping) else None
        return prop if isinstance(prop, Mapping) else None

    def property_type(self, name: str) -> ValueType:
        """What parameter ``name`` may hold (anything, if it is not declared)."""
        if name not in self._properties:
            prop = self.property_schema(name)
            self._properties[name] = self.value_type(prop) if prop is not None else ValueType()
        return self._properties[name]

    def value_type(self, schema: Mapping[str, Any]) -> ValueType:
        # a cycle through anyOf/oneOf: no constraint from it
        return self._once(schema, self._types, self._typing, self._value_type, ValueType())

    @staticmethod
    def _once(schema: Mapping[str, Any], done: dict[int, tuple[Any, Any]], active: set[int],
              compute: Callable[[Mapping[str, Any]], Any], on_cycle: Any) -> Any:
        """`compute(schema)` once per node (keyed by id, the node kept alive beside its
        result); a node met again while it is computed is a cycle: `on_cycle`."""
        key = id(schema)
        if key in done:
            return done[key][1]
        if key in active:
            return on_cycle
        active.add(key)
        try:
            out = compute(schema)
        finally:
            active.discard(key)
        done[key] = (schema, out)
        return out

    def _value_type(self, schema: Mapping[str, Any]) -> ValueType:
        s = self.resolve(schema)
        declared = s.get("type")
        names = [declared] if isinstance(declared, str) else list(declared) if isinstance(declared, list) else []
        nullable = "null" in names or s.get("nullable") is True
        types = [t for t in names if isinstance(t, str) and t != "null"]
        enum: tuple[Any, ...] | None = None
        if isinstance(s.get("enum"), list):
            enum = tuple(s["enum"])
        elif "const" in s:
            enum = (s["const"],)
        branches = [b for key in ("anyOf", "oneOf") if isinstance(s.get(key), list) for b in s[key]
                    if isinstance(b, Mapping)]
        if branches and self._spend(len(branches)):
            kinds = [self.value_type(b) for b in branches]
            nullable = nullable or any(k.nullable for k in kinds)
            # A branch that only says "null" adds nullability, nothing else.
            real = [k for k in kinds if k.types or k.enum is not None or not k.nullable]
            if not types:
                types = [t for k in real for t in k.types]
                if real and all(k.enum is not None and not k.types for k in real):
                    enum = tuple(m for k in real for m in k.enum or ())
        if enum is not None and None in enum:
            nullable = True
        return ValueType(tuple(dict.fromkeys(types)), nullable, enum)


def _props(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, Mapping) else {}


def resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with ``$ref`` followed and ``allOf`` merged in (later wins per key)."""
    return SchemaResolver(root).resolve(schema)


def lookup_ref(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#"):
        return {}  # remote refs are not fetched
    node: Any = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def property_schema(root: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    """The schema of parameter ``name`` in a parameters schema, None if not declared."""
    if root is None:
        return None
    return SchemaResolver(root).property_schema(name)


def value_type(schema: Mapping[str, Any], root: Mapping[str, Any]) -> ValueType:
    return SchemaResolver(root).value_type(schema)


def convert_value(
    raw: str, schema: Mapping[str, Any] | None, root: Mapping[str, Any] | None = None
) -> Any:
    """Raw parameter text → a JSON-serialisable value, typed by ``schema``."""
    vt = value_type(schema, root if root is not None else schema) if schema else ValueType()
    return convert_typed(raw, vt)


def convert_typed(raw: str, vt: ValueType) -> Any:
    """Raw parameter text → a JSON-serialisable value of the type ``vt`` allows."""
    text = raw.strip()
    if vt.enum is not None and not vt.types:
        member = _enum_member(raw, vt.enum)
        if member is not _FAIL:
            return member
    low = text.lower()
    if (low == "null" and (vt.nullable or "string" not in vt.types)) or (low == "none" and "string" not in vt.types):
        return None  # "None": Qwen3-Coder's template writes a null with Python's str
    for name in sorted(vt.types, key=lambda t: _ORDER.index(t) if t in _ORDER else len(_ORDER)):
        value = _CONVERTERS.get(name, _to_json)(raw)
        if value is not _FAIL:
            return value
    value = _to_json(raw)
    return raw if value is _FAIL else value


def _enum_member(raw: str, members: tuple[Any, ...]) -> Any:
    text = raw.strip()
    for candidate in (raw, text):  # the text as written first: " a" is " a" where both " a" and "a" are members
        for m in members:
            if isinstance(m, str) and m == candidate:
                return m
    parsed = _to_json(raw)
    for m in members:
        if not isinstance(m, str) and parsed is not _FAIL and _same(parsed, m):
            return m
    return _FAIL


def _same(a: Any, b: Any) -> bool:
    # bool is an int in Python; 1 must not match True.
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _to_string(raw: str) -> Any:
    return raw


def _to_integer(raw: str) -> Any:
    text = raw.strip()
    if _INT.fullmatch(text):
        return _int(text)
    number = _to_number(raw)
    return number if isinstance(number, int) else _FAIL


def _int(text: str) -> Any:
    # int() refuses more than sys.get_int_max_str_digits() digits (4300) with ValueError;
    # a model can emit such a run of digits, which must stay text, not fail the response.
    try:
        return int(text)
    except ValueError:
        return _FAIL


def _to_number(raw: str) -> Any:
    text = raw.strip()
    if _INT.fullmatch(text):
        return _int(text)
    if not _NUMBER.fullmatch(text):
        return _FAIL
    value = float(text)
    if not math.isfinite(value):
        return _FAIL
    return int(value) if value.is_integer() else value


def _to_boolean(raw: str) -> Any:
    text = raw.strip().lower()
    return {"true": True, "false": False}.get(text, _FAIL)


def _container(kind: type) -> Any:
    def convert(raw: str) -> Any:
        value = _to_json(raw)
        if isinstance(value, kind):
            return value
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return _FAIL
        if kind is list and isinstance(value, tuple):
            value = list(value)
        return value if isinstance(value, kind) and _serialisable(value) else _FAIL

    return convert


def _serialisable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN/Infinity would not round-trip


def _finite_float(text: str) -> float:
    # 1e400 is a valid JSON number but parses to inf, which json.dumps writes as the
    # non-JSON token Infinity: refused like the NaN/Infinity names.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def round_trip_json(text: str, strict: bool = True) -> Any:
    """`json.loads` of what `json.dumps` writes back as JSON: no NaN/Infinity, no number
    that overflows a float (`strict=False`: raw control characters in strings allowed)."""
    return json.loads(text, strict=strict, parse_constant=_no_constant, parse_float=_finite_float)


def _to_json(raw: str) -> Any:
    try:
        return round_trip_json(raw.strip())
    except (ValueError, RecursionError):
        return _FAIL


_CONVERTERS = {
    "string": _to_string,
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
    "object": _container(dict),
    "array": _container(list),
}
