"""Pydantic's validation errors → one message written for the client.

The client should read the field as it wrote it and what is allowed there:
`messages[0].content must be a string or an array`, `temperature must be between 0 and
100 (got 150.0)`, never pydantic's internals (`tool_choice.literal['none','auto']`,
`messages[0].content.str`, "Value error, …", "Input should be …").

Pydantic reports a union that no branch accepted as one error per branch, with the
branch's type tag in the location. The tags are dropped from the path; if some branch
got further into the value than the others (the client evidently meant that branch),
its deepest errors win, otherwise the branches' expectations are joined with "or".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgemoe.server.limits import describe_number

# What each pydantic type error expects, as a noun phrase.
_EXPECTED = {
    "string_type": "a string", "string_unicode": "a string",
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "list_type": "an array", "tuple_type": "an array", "iterable_type": "an array",
    "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
    "none_required": "null",
}
# Pydantic's names for types, as they appear as union tags in error locations.
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "any", "dict", "list", "tuple", "set", "bytes"})


def is_branch_tag(part: str | int) -> bool:
    """Whether a location part names a union branch (a type) rather than a client's key.

    NOTE: our request models' field names are lower-case identifiers; tags are type
    names (`str`), generic forms (`list[str]`, `function-after[…]`) or model classes.
    """
    if not isinstance(part, str) or not part:
        return False
    return part in _TYPE_TAGS or "[" in part or part[0].isupper()


def param_of(loc: Sequence[str | int]) -> str | None:
    """("body", "messages", 0, "content", "str") → "messages[0].content"."""
    # FastAPI's first part says where the value came from: the client knows the name alone.
    parts = [p for p in (loc[1:] if loc and loc[0] in _SOURCES else loc) if not is_branch_tag(p)]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _depth_after_union(loc: Sequence[str | int]) -> int:
    """How many client path parts follow the first union tag (0: none, or no union)."""
    for i, part in enumerate(loc):
        if is_branch_tag(part):
            return sum(1 for p in loc[i + 1 :] if not is_branch_tag(p))
    return 0


def _predicate(error: Mapping[str, Any]) -> str:
    """The error as a verb phrase following the field name ("must be …", "is required")."""
    kind, ctx = error.get("type", ""), error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind in _EXPECTED:
        return f"must be {_EXPECTED[kind]}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected', 'one of the documented values')}"
    if kind in ("too_long", "too_short"):
        bound = ctx.get("max_length", ctx.get("min_length"))
        side = "at most" if kind == "too_long" else "at least"
        noun = "item" if bound == 1 else "items"
        return f"must have {side} {bound} {noun} (got {ctx.get('actual_length')})"
    if kind in ("string_too_long", "string_too_short"):
        bound = ctx.get("max_length", ctx.get("min_length"))
        side = "at most" if kind == "string_too_long" else "at least"
        return f"must have {side} {bound} characters"
    bound = {"greater_than_equal": (">=", "ge"), "less_than_equal": ("<=", "le"),
             "greater_than": (">", "gt"), "less_than": ("<", "lt")}.get(kind)
    if bound is not None:
        return f"must be {bound[0]} {ctx.get(bound[1])} (got {describe_number(error.get('input'))})"
    if kind in ("value_error", "assertion_error"):
        return f": {ctx.get('error', error.get('msg', ''))}"
    message = str(error.get("msg", "is not valid"))
    return message if message.startswith(("must", "may")) else f": {message[:1].lower()}{message[1:]}"


def _sentence(param: str | None, predicate: str) -> str:
    if param is None and predicate.startswith(":"):
        return predicate.removeprefix(":").strip() or "invalid request"
    if param is None:
        return f"the request body {predicate}"
    return f"{param}{predicate}" if predicate.startswith(":") else f"{param} {predicate}"


def describe(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for a list of pydantic errors (from one request body)."""
    first = errors[0]
    loc = tuple(first.get("loc") or ())
    union_at = next((i for i, p in enumerate(loc) if is_branch_tag(p)), None)
    if union_at is None:
        chosen: list[Mapping[str, Any]] = [first]
        rest = len({param_of(e.get("loc") or ()) for e in errors}) - 1
    else:
        prefix = loc[:union_at]
        group = [e for e in errors if tuple(e.get("loc") or ())[:union_at] == prefix]
        deepest = max(_depth_after_union(e.get("loc") or ()) for e in group)
        chosen = [e for e in group if _depth_after_union(e.get("loc") or ()) == deepest]
        if deepest > 0:  # the client meant the branch that got furthest: its errors at one path
            target = param_of(chosen[0].get("loc") or ())
            chosen = [e for e in chosen if param_of(e.get("loc") or ()) == target]
        rest = len({param_of(e.get("loc") or ()) for e in errors if e not in group})
    param = param_of(chosen[0].get("loc") or ())
    phrases = _expectations(chosen)
    if len(chosen) > 1 and phrases:
        head = ", ".join(phrases[:-1])
        message = _sentence(param, f"must be {head} or {phrases[-1]}" if head else f"must be {phrases[0]}")
    else:
        specific = [e for e in chosen if e.get("type") not in _EXPECTED] or chosen
        message = _sentence(param, _predicate(specific[0]))
    if rest > 0:
        message += f" (and {rest} more error{'s' if rest > 1 else ''})"
    return message, param


def _expectations(errors: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the alternatives expect ("'none'", "'auto'", "an object"), or [] if some error
    is not a plain type mismatch (then it alone explains the refusal)."""
    phrases: list[str] = []
    for e in errors:
        kind = e.get("type")
        if kind == "literal_error":
            expected = str((e.get("ctx") or {}).get("expected", ""))
            phrases.extend(p.strip() for p in expected.replace(" or ", ", ").split(", ") if p.strip())
        elif kind in _EXPECTED:
            phrases.append(_EXPECTED[kind])
        else:
            return []
    return list(dict.fromkeys(phrases))
