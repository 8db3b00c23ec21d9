"""allOf (and $ref or anyOf with constraining siblings) as one merged schema.

A byte grammar cannot run two schemas' automata in lockstep cheaply, so an intersection is
computed on the keywords instead, where that is simple and exact: `type` lists intersect
(integer within number), `required` lists unite, `properties` merge name by name (a name in
both becomes an allOf of the two), min bounds take the larger and max bounds the smaller
(numeric ones too; draft 4's boolean exclusive flags only where the parts agree),
`enum` lists intersect, `items` schemas combine by allOf, `nullable: true` counts as null
in the part's `type`, two different `pattern`s (or `format`s) leave the string unenforced,
`multipleOf`s meet at their least common multiple, and unenforced keywords (uniqueItems,
...) keep the first part's value.
Parts that cannot meet (no common type, enum value or const) raise Unsatisfiable, which
the compiler prunes like any part with no value. Anything else that differs between parts
raises GrammarError rather than be dropped: two different anyOf lists, prefixItems,
additionalProperties, or an additionalProperties that would forbid a property another
part declares.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from edgemoe.structured.errors import GrammarError, Unsatisfiable
from edgemoe.structured.keywords import ANNOTATIONS, CONTAINERS, TYPES, UNENFORCED
from edgemoe.structured.ranged_number import as_fraction, fraction_lcm

Schema = dict[str, Any]


def _types(value: object) -> list[str]:
    """A `type` value as a list (already validated by the compiler's keyword check)."""
    return [value] if isinstance(value, str) else list(value)  # type: ignore[arg-type]


def _type_meet(a: object, b: object, path: str) -> list[str]:
    """Types allowed by both: integer survives against number; none in common is an error."""
    for t in (a, b):
        if not isinstance(t, (str, list)):
            raise GrammarError(f"{path}.type".lstrip("."), "type must be a type name or an array of them")
    ta, tb = _types(a), _types(b)
    out = [t for t in TYPES if (t in ta or (t == "integer" and "number" in ta))
           and (t in tb or (t == "integer" and "number" in tb))]
    if not out:
        raise Unsatisfiable(path, f"allOf parts allow no common type ({ta} and {tb})")
    return out


def _canon(value: object) -> str:
    """A JSON value's canonical text, the key for comparing enum members."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _check_closed(closed: Schema, other: Schema, path: str) -> None:
    """A part with additionalProperties other than true forbids (or constrains) names it
    does not declare: if another part declares more, merging would loosen it."""
    if closed.get("additionalProperties", True) is True:
        return
    extra = set(other.get("properties", {})) - set(closed.get("properties", {}))
    if extra:
        raise GrammarError(path, f"allOf: additionalProperties in one part and property {sorted(extra)[0]!r} declared in another cannot be merged")


def _merge_items(a: object, b: object) -> object:
    """items/additional schemas: false wins, true is neutral, two schemas combine by allOf."""
    if a is False or b is False:
        return False
    if a is True:
        return b
    if b is True:
        return a
    return {"allOf": [a, b]}


def _merge_props(a: Schema, b: Schema) -> Schema:
    """properties: union in first-seen order; a name in both parts must satisfy both."""
    out = dict(a)
    for name, sub in b.items():
        out[name] = {"allOf": [out[name], sub]} if name in out and out[name] != sub else sub
    return out


def _meet_enum(a: list, b: list, path: str) -> list:
    """enum: the values in both lists (compared by canonical JSON text)."""
    keys = {_canon(v) for v in b}
    out = [v for v in a if _canon(v) in keys]
    if not out:
        raise Unsatisfiable(path, "allOf parts' enum lists have no value in common")
    return out


_RULES: dict[str, Callable[[Any, Any], Any]] = {
    "required": lambda a, b: list(dict.fromkeys([*a, *b])),
    "properties": _merge_props,
    "items": _merge_items,
    "minItems": max, "minLength": max,
    "maxItems": min, "maxLength": min,
}
_UNENFORCEABLE = "(?!)"  # a pattern outside regex.py's subset: accepted, not enforced
_NUMERIC = {"minimum": max, "exclusiveMinimum": max, "maximum": min, "exclusiveMaximum": min}


def _tighter(key: str, a: object, b: object, path: str) -> object:
    """Two parts' numeric bound: the tighter (a draft 4 flag, or not a number: refused)."""
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (a, b)):
        raise GrammarError(path, f"allOf parts give different values for {key!r}, which cannot be merged")
    return _NUMERIC[key](a, b)


def _common_multiple(a: object, b: object, path: str) -> object:
    """Two parts' multipleOf: their least common multiple (as the schema's JSON would write it)."""
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in (a, b)):
        raise GrammarError(path, "allOf parts give multipleOf values that are not positive numbers")
    m = fraction_lcm(as_fraction(a), as_fraction(b))  # type: ignore[arg-type]
    if m.denominator == 1:
        return int(m)
    if as_fraction(float(m)) != m:
        raise GrammarError(path, f"allOf parts' multipleOf values {a} and {b} have no common multiple a double writes")
    return float(m)


def merge2(a: Schema, b: Schema, path: str) -> Schema:
    """The schema that both `a` and `b` (dicts without $ref/allOf) describe."""
    _check_closed(a, b, path)
    _check_closed(b, a, path)
    out = {k: v for k, v in a.items() if k not in ANNOTATIONS and k not in CONTAINERS}
    for key, value in b.items():
        if key in ANNOTATIONS or key in CONTAINERS:
            continue
        if key not in out or out[key] == value:
            out[key] = value
        elif key == "type":
            out[key] = _type_meet(out[key], value, path)
        elif key == "enum":
            out[key] = _meet_enum(out[key], value, path)
        elif key in _RULES:
            out[key] = _RULES[key](out[key], value)
        elif key in _NUMERIC:
            out[key] = _tighter(key, out[key], value, path)
        elif key == "multipleOf":
            out[key] = _common_multiple(out[key], value, path)
        elif key in ("pattern", "format"):  # two patterns can't be intersected here: neither is enforced
            out[key] = _UNENFORCEABLE
        elif key == "const" and _canon(out[key]) != _canon(value):
            raise Unsatisfiable(path, "allOf parts require different const values")
        elif key not in UNENFORCED:
            raise GrammarError(path, f"allOf parts give different values for {key!r}, which cannot be merged")
    return out


def _denull(part: Schema) -> Schema:
    """OpenAPI's nullable as a type: null joins `type` (a part without `type` allows null
    already), so parts meet by type intersection."""
    if "nullable" not in part:
        return part
    out = {k: v for k, v in part.items() if k != "nullable"}
    if part["nullable"] is True and isinstance(out.get("type"), (str, list)):
        out["type"] = [*_types(out["type"]), "null"]
    return out


def _draft4_bounds(part: Schema) -> Schema:
    """Draft 4's `exclusiveMinimum: true` belongs to its own part's `minimum`: as a numeric
    exclusive bound it meets another part's bounds correctly (and `false` says nothing)."""
    out = dict(part)
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(flag), bool):
            if out.pop(flag) and bound in out:
                out[flag] = out.pop(bound)
    return out


def merge_all(parts: list[Schema], path: str) -> Schema:
    """The schema all `parts` (plain dicts, see merge2) describe together."""
    parts = [_draft4_bounds(_denull(p)) for p in parts]
    if not parts:
        return {}
    out = {k: v for k, v in parts[0].items() if k not in ANNOTATIONS and k not in CONTAINERS}
    for part in parts[1:]:
        out = merge2(out, part, path)
    return out
