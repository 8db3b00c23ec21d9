"""JSON Schema -> grammar (the IR of ir.py, lowered to runtime slots).

Supported keywords and their limits are listed in keywords.py; choices made here:
- Objects with declared properties are generated with exactly those properties, in the
  schema's declared order (out-of-order or extra keys are refused even where the schema
  would allow them), required ones always and optional ones when the model writes them.
  Keys are written as json.dumps(key, ensure_ascii=False). A `required` name that is not
  declared is appended (in `required` order) with the additionalProperties schema (any
  value if absent/true); with additionalProperties false it is a GrammarError.
- An object with no declared properties: additionalProperties false allows only {}; true,
  absent or a schema allows arbitrary string keys, each value of that schema.
- enum/const values are written as their compact canonical text (json.dumps, no spaces),
  filtered by type/nullable, bounds, lengths, pattern and required/closed keys (shallow).
- oneOf as anyOf (an output may match two); allOf, $ref/anyOf beside constraints: merged (merge.py).
- `items` absent means any items; `items: false` ends the array after prefixItems.
- A part that can produce no finite value (false, items false below minItems, a required
  child that recurses forever, merged parts whose types/enum/const do not meet, an enum
  with no value of the schema's type, a type no value of which is in the bounds) is
  pruned: a type, an anyOf alternative, an optional property, an array length; a root left
  with nothing is a GrammarError naming the part, as are direct contradictions anywhere.
- Objects and arrays nest at most MAX_NESTING (128) deep in the output (scalars.py).
Bounds against hostile input: 5,000 subschemas, subschemas nested 64 deep, 1,000 enum
values, 1 MB of enum/const text, 100,000 alternatives after expanding anyOf/$ref (ir.py).
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any
from urllib.parse import unquote

from edgemoe.structured.errors import GrammarError, Unsatisfiable
from edgemoe.structured.ir import LeafIR, SlotIR, lower
from edgemoe.structured.keywords import ENFORCED, IMPLIES, TYPES, check_keywords
from edgemoe.structured.merge import merge_all
from edgemoe.structured.nodes import Slot
from edgemoe.structured.pattern_string import fits_pattern, string_pattern
from edgemoe.structured.ranged_number import as_fraction, number_range, read_range

MAX_SUBSCHEMAS = 5000
MAX_DEPTH = 64
MAX_ENUM = 1000
MAX_LITERAL_BYTES = 1 << 20
MAX_KEY_BYTES = 1 << 23  # canonical text of merged schemas, for spotting repeats


def _join(path: str, *parts: object) -> str:
    """A dotted path one or more steps below `path`."""
    return ".".join([path, *map(str, parts)] if path else list(map(str, parts)))


def _count(schema: dict, key: str, path: str) -> int | None:
    """A non-negative integer keyword (minItems, maxLength, ...), None when absent."""
    if key not in schema:
        return None
    value = schema[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GrammarError(_join(path, key), f"{key} must be a non-negative integer, not {value!r}")
    return value


def _canon(value: object, path: str) -> str:
    """The one text an enum/const value is written as."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise GrammarError(path, f"value {value!r} is not JSON: {exc}") from None


def _is_type(value: object, name: str) -> bool:
    """Whether a JSON value (as json.loads gives it) has JSON Schema type `name`."""
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    return isinstance(value, list if name == "array" else dict)


class _Compiler:
    """Walks a schema breadth-first: a subschema is a slot queued for filling, so $ref
    cycles and long $ref chains cost no recursion; only document nesting recurses."""

    def __init__(self, root: object) -> None:
        self.root = root
        self.memo: dict[int, SlotIR] = {}
        self.keep: list[object] = []  # merged dicts, kept alive so their ids stay unique
        self.queue: deque[tuple[SlotIR, object, int]] = deque()
        self.count = self.literal_bytes = self.key_bytes = 0
        self.merged: dict[str, SlotIR] = {}  # canonical merged schema -> its slot

    def run(self) -> Slot:
        """Compile the whole schema; GrammarError if it cannot be honoured."""
        root = self.slot_for(self.root, "", 0)
        while self.queue:
            self._fill(*self.queue.popleft())
        slot, why = lower(root)
        if slot is None:
            raise GrammarError(*why)
        return slot

    def _tick(self, path: str, depth: int) -> None:
        """Bound the work on hostile input: subschema count and nesting depth."""
        self.count += 1
        if self.count > MAX_SUBSCHEMAS or depth > MAX_DEPTH:
            raise GrammarError(path, f"more than {MAX_SUBSCHEMAS} subschemas" if depth <= MAX_DEPTH
                               else f"subschemas nested more than {MAX_DEPTH} deep")

    def slot_for(self, schema: object, path: str, depth: int) -> SlotIR:
        """The slot of a subschema (one per dict object, so a $ref target is shared)."""
        got = self.memo.get(id(schema)) if isinstance(schema, dict) else None
        if got is not None:
            return got
        self._tick(path, depth)
        slot = SlotIR(path)
        if isinstance(schema, dict):
            self.memo[id(schema)] = slot
            self.keep.append(schema)
        self.queue.append((slot, schema, depth))
        return slot

    def _resolve(self, ref: object, path: str) -> tuple[object, str]:
        """A local $ref: "#" or a JSON pointer "#/a/b" into this document."""
        where = _join(path, "$ref")
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise GrammarError(where, f"only local $ref ('#' or '#/...') is supported, not {ref!r}")
        node, parts = self.root, []
        for raw in ref[2:].split("/") if ref != "#" else []:
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise GrammarError(where, f"$ref {ref!r} does not resolve")
            parts.append(part)
        return node, ".".join(parts)

    def _expand(self, schema: object, path: str, depth: int) -> list[dict]:
        """A schema as the list of plain parts (no $ref, no allOf) that all must hold."""
        self._tick(path, depth)
        if schema is True:
            return []
        if not isinstance(schema, dict):
            if schema is False:
                raise Unsatisfiable(path, "allOf has a false part")
            raise GrammarError(path, "allOf part must be a schema object")
        rest = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
        check_keywords(rest, path)  # before merging: two parts' patterns merge into an unenforced one
        parts = [rest]
        if "$ref" in schema:
            target, tpath = self._resolve(schema["$ref"], path)
            parts += self._expand(target, tpath, depth + 1)
        for i, sub in enumerate(self._list(schema, "allOf", path) or []):
            parts += self._expand(sub, _join(path, "allOf", i), depth + 1)
        return parts

    def _list(self, schema: dict, key: str, path: str) -> list | None:
        """A keyword that must be a non-empty list (anyOf, oneOf, allOf, enum)."""
        if key not in schema:
            return None
        value = schema[key]
        if not isinstance(value, list) or not value:
            raise GrammarError(_join(path, key), f"{key} must be a non-empty array")
        return value

    def _fill(self, slot: SlotIR, schema: object, depth: int) -> None:
        """Compile one subschema into its slot's leaves and included slots; a part that no
        value satisfies leaves the slot empty (pruned by ir.lower, or reported from there)."""
        try:
            self._fill_parts(slot, schema, depth)
        except Unsatisfiable as exc:
            slot.leaves.clear()
            slot.alts.clear()
            slot.why = (exc.path, exc.problem)

    def _merged_slot(self, merged: dict, slot: SlotIR) -> SlotIR:
        """The slot first filled with an equal merged schema (else `slot`): recursion through
        allOf, $ref-with-siblings or anyOf-with-siblings then closes a cycle instead of
        unrolling until the depth limit."""
        if self.key_bytes > MAX_KEY_BYTES:
            return slot
        try:
            key = json.dumps(merged, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            return slot
        self.key_bytes += len(key)
        return self.merged.setdefault(key, slot)

    def _fill_parts(self, slot: SlotIR, schema: object, depth: int) -> None:
        """The body of _fill."""
        path = slot.path
        if schema is True:
            slot.leaves.append(LeafIR("any", path))
            return
        if schema is False:
            return  # no value: pruned by ir.lower, or an error naming this path
        if not isinstance(schema, dict):
            raise GrammarError(path, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        check_keywords(schema, path)
        if schema.get("nullable") is True and {"$ref", "allOf", "anyOf", "oneOf"} & schema.keys():
            self._or_null(slot, schema, depth)
            return
        constraining = {k for k in schema if k in ENFORCED} - {"$ref", "allOf"}
        if "allOf" in schema or ("$ref" in schema and constraining):
            merged = merge_all(self._expand(schema, path, depth), path)
            self.keep.append(merged)
            same = self._merged_slot(merged, slot)
            if same is not slot:
                slot.alts.append(same)
                return
            self._fill_parts(slot, merged, depth)
            return
        if "$ref" in schema:
            target, tpath = self._resolve(schema["$ref"], path)
            slot.alts.append(self.slot_for(target, tpath, tpath.count(".") + 1 if tpath else 0))
            return
        if "anyOf" in schema or "oneOf" in schema:
            self._any_of(slot, schema, depth)
            return
        if not constraining:
            slot.leaves.append(LeafIR("any", path))
            return
        if "enum" in schema or "const" in schema:
            self._literals(slot, schema, self._types({k: v for k, v in schema.items() if k in ("type", "nullable")}, path))
            return
        empty = None
        for name in self._types(schema, path):
            try:
                self._typed(slot, schema, name, depth)
            except Unsatisfiable as exc:  # this type has no value here; the others may
                empty = exc
        if empty is not None and not slot.leaves:
            raise empty

    def _or_null(self, slot: SlotIR, schema: dict, depth: int) -> None:
        """nullable: true next to $ref/allOf/anyOf/oneOf (OpenAPI): null, or the rest."""
        slot.leaves.append(LeafIR("literals", slot.path, texts=frozenset({b"null"})))
        rest = {k: v for k, v in schema.items() if k != "nullable"}
        self.keep.append(rest)
        sub = SlotIR(slot.path)
        self._tick(slot.path, depth)
        self.queue.append((sub, rest, depth))
        slot.alts.append(sub)

    def _any_of(self, slot: SlotIR, schema: dict, depth: int) -> None:
        """anyOf/oneOf: each alternative, with the constraining siblings merged into it."""
        path = slot.path
        if "anyOf" in schema and "oneOf" in schema:
            raise GrammarError(path, "anyOf and oneOf together are not supported")
        key = "anyOf" if "anyOf" in schema else "oneOf"
        alts = self._list(schema, key, path) or []
        rest = {k: v for k, v in schema.items() if k in ENFORCED and k != key}
        for i, alt in enumerate(alts):
            where = _join(path, key, i)
            if rest and alt is not False:
                alt = {"allOf": [rest, alt]}
                self.keep.append(alt)
                sub = SlotIR(where)
                self._tick(where, depth + 1)
                self.queue.append((sub, alt, depth + 1))
            else:
                sub = self.slot_for(alt, where, depth + 1)
            slot.alts.append(sub)

    def _types(self, schema: dict, path: str) -> list[str]:
        """The types to generate: `type` (+ null if nullable), or those its keywords imply,
        or all of them. integer is dropped when number is there (it is a subset)."""
        if "type" in schema:
            raw = schema["type"]
            names = [raw] if isinstance(raw, str) else raw
            if not isinstance(names, list) or not names:
                raise GrammarError(_join(path, "type"), "type must be a type name or a non-empty array of them")
            for name in names:
                if name not in TYPES:
                    raise GrammarError(_join(path, "type"), f"unknown type {name!r} (expected one of {', '.join(TYPES)})")
        else:
            names = [t for t, kws in IMPLIES.items() if kws & schema.keys()] or list(TYPES)
        nullable = schema.get("nullable", False)
        if not isinstance(nullable, bool):
            raise GrammarError(_join(path, "nullable"), "nullable must be a boolean")
        out = [t for t in TYPES if t in names or (t == "null" and nullable)]
        return [t for t in out if not (t == "integer" and "number" in out)]

    def _literals(self, slot: SlotIR, schema: dict, types: list[str]) -> None:
        """enum/const: the values that fit the schema's other (shallow) constraints."""
        path = slot.path
        values = self._list(schema, "enum", path)
        if values is not None and len(values) > MAX_ENUM:
            raise GrammarError(_join(path, "enum"), f"more than {MAX_ENUM} enum values")
        if "const" in schema:
            want = _canon(schema["const"], _join(path, "const"))
            values = [v for v in (values or [schema["const"]]) if _canon(v, path) == want]
            if not values:
                raise Unsatisfiable(_join(path, "const"), "const is not one of the enum values")
        assert values is not None
        texts = {_canon(v, _join(path, "enum")).encode() for v in values if self._fits(v, schema, types, path)}
        if not texts:
            where = _join(path, "enum" if "enum" in schema else "const")
            raise Unsatisfiable(where, "no enum/const value fits the schema's type and bounds")
        self.literal_bytes += sum(map(len, texts))
        if self.literal_bytes > MAX_LITERAL_BYTES:
            raise GrammarError(path, f"enum/const values longer than {MAX_LITERAL_BYTES} bytes in all")
        slot.leaves.append(LeafIR("literals", path, texts=frozenset(texts)))

    def _fits(self, value: Any, schema: dict, types: list[str], path: str) -> bool:
        """Shallow check of an enum value against type, lengths and closed/required keys."""
        if not any(_is_type(value, t) for t in types):
            return False
        if isinstance(value, str):
            lo, hi = _count(schema, "minLength", path) or 0, _count(schema, "maxLength", path)
            return lo <= len(value) and (hi is None or len(value) <= hi) and fits_pattern(schema, value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (rng := read_range(schema, path)) is None or rng.contains(as_fraction(value))
        if isinstance(value, list):
            lo, hi = _count(schema, "minItems", path) or 0, _count(schema, "maxItems", path)
            return lo <= len(value) and (hi is None or len(value) <= hi)
        if isinstance(value, dict):
            if not set(schema.get("required", [])) <= value.keys():
                return False
            return schema.get("additionalProperties", True) is not False or value.keys() <= set(schema.get("properties", {}))
        return True

    def _typed(self, slot: SlotIR, schema: dict, name: str, depth: int) -> None:
        """One leaf for one type name."""
        path = slot.path
        if name in ("null", "boolean"):
            words = {b"null"} if name == "null" else {b"true", b"false"}
            slot.leaves.append(LeafIR("literals", path, texts=frozenset(words)))
        elif name in ("number", "integer"):
            slot.leaves.append(LeafIR(name, path, num=number_range(schema, path, name == "integer")))
        elif name == "string":
            lo, hi = _count(schema, "minLength", path) or 0, _count(schema, "maxLength", path)
            if hi is not None and lo > hi:
                raise GrammarError(_join(path, "minLength"), f"minLength {lo} > maxLength {hi}")
            slot.leaves.append(LeafIR("string", path, lo=lo, hi=hi, pattern=string_pattern(schema, lo, hi)))
        elif name == "array":
            slot.leaves.append(self._array(schema, path, depth))
        else:
            slot.leaves.append(self._object(schema, path, depth))

    def _array(self, schema: dict, path: str, depth: int) -> LeafIR:
        """prefixItems, items (absent: any; false: none past the prefix), min/maxItems."""
        lo, hi = _count(schema, "minItems", path) or 0, _count(schema, "maxItems", path)
        if hi is not None and lo > hi:
            raise GrammarError(_join(path, "minItems"), f"minItems {lo} > maxItems {hi}")
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise GrammarError(_join(path, "prefixItems"), "prefixItems must be an array of schemas")
        items = schema.get("items", True)
        if not isinstance(items, (bool, dict)):
            raise GrammarError(_join(path, "items"), "items must be a schema (for tuples use prefixItems)")
        slots = tuple(self.slot_for(s, _join(path, "prefixItems", i), depth + 1) for i, s in enumerate(prefix))
        item = None if items is False else self.slot_for(items, _join(path, "items"), depth + 1)
        return LeafIR("array", path, prefix=slots, items=item, lo=lo, hi=hi)

    def _object(self, schema: dict, path: str, depth: int) -> LeafIR:
        """Declared properties in order, or free keys when none are declared."""
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise GrammarError(_join(path, "properties"), "properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise GrammarError(_join(path, "required"), "required must be an array of strings")
        extra = [r for r in dict.fromkeys(required) if r not in props]
        more = schema.get("additionalProperties", True)
        if not isinstance(more, (bool, dict)):
            raise GrammarError(_join(path, "additionalProperties"), "additionalProperties must be a schema")
        if extra and more is False:
            raise GrammarError(_join(path, "required"), f"required property {extra[0]!r} is not in properties and additionalProperties is false")
        if not props and not extra:
            if more is False:
                return LeafIR("object", path)
            return LeafIR("dict", path, value=self.slot_for(more, _join(path, "additionalProperties"), depth + 1))
        if not all(isinstance(name, str) for name in props):
            raise GrammarError(_join(path, "properties"), "property names must be strings")
        needed = set(required)
        out = [(name, self.slot_for(sub, _join(path, "properties", name), depth + 1), name in needed)
               for name, sub in props.items()]
        out += [(name, self.slot_for(more, _join(path, "additionalProperties"), depth + 1), True) for name in extra]
        return LeafIR("object", path, props=tuple(out))


def compile_schema(schema: object) -> Slot:
    """The runtime root slot for a JSON Schema (dict or True); GrammarError if unsupported."""
    try:
        return _Compiler(schema).run()
    except RecursionError:
        raise GrammarError("", "schema nested too deep") from None

