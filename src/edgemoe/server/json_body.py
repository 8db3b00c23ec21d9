"""Request JSON → Python objects, refusing invalid Unicode, without holding the GIL for long.

The parse runs in a worker thread, but a C parser holds the GIL for the whole document
(a 36 MiB body of a million small objects: 1.2 s in which the event loop cannot run).
So a body past `YIELDING_BYTES` is parsed piecewise: objects and arrays down to
`PIECEWISE_DEPTH` member by member, each piece by the C decoder, which lets other
threads (the event loop) run between pieces. Smaller bodies take pydantic's parser
(one call, fast).

Invalid Unicode: pydantic's parser refuses a lone surrogate (`"\\ud800"`); for the
piecewise parse (Python's decoder accepts them) the result is searched when the text
holds a surrogate escape at all. Either way `InvalidUnicode` names the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic_core

YIELDING_BYTES = 4 * 2**20
# Containers this deep are parsed piece by piece (the body, `messages`, a message,
# its `content`), deeper ones whole.
PIECEWISE_DEPTH = 4
SMALL_CHARS = 512  # a container that ends within this many characters is parsed in one piece
# pydantic's parser refuses arrays/objects nested deeper than this; the piecewise parse
# (Python's decoder goes to ~990) refuses the same, or a big body would carry values
# deep enough to fail the JSON encoders and templates downstream (RecursionError: a 500).
MAX_NESTING = 200
_WS = re.compile(r"[ \t\n\r]*")
# Up to 4096 JSON integers in a row, not followed by more of a number.
_INT_RUN = re.compile(r"-?(?:0|[1-9]\d{0,30})(?:[ \t\n\r]*,[ \t\n\r]*-?(?:0|[1-9]\d{0,30})){0,4095}(?![\d.eE])")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_decoder = json.JSONDecoder()


class InvalidJSON(ValueError):
    """The body is not JSON (the message says where)."""


class InvalidUnicode(ValueError):
    """A string of the body holds a lone surrogate: not a character."""

    def __init__(self, path: str, char: str) -> None:
        # The path may hold the surrogate itself (a key): escaped, or no answer could be encoded.
        self.path = path.encode("utf-8", "backslashreplace").decode("utf-8")
        self.char = char
        super().__init__(f"{self.path or 'the request body'} holds a lone surrogate")


def parse_json(body: bytes) -> Any:
    """The body's JSON value; raises InvalidJSON or InvalidUnicode. Blocking (for a worker)."""
    if len(body) < YIELDING_BYTES:
        try:
            return pydantic_core.from_json(body)
        except ValueError as exc:
            raise _explain(body, str(exc)) from None
    try:
        text = body.decode("utf-8")
        value = _parse_piecewise(text)
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"not UTF-8 at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise InvalidJSON(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        raise InvalidJSON(str(exc)) from None
    if _SURROGATE_ESCAPE.search(text) and (found := find_surrogate(value)) is not None:
        raise InvalidUnicode(*found)
    return value


def _explain(body: bytes, why: str) -> ValueError:
    """pydantic's parse error; for a lone surrogate, the field that holds it."""
    if "surrogate" in why or "hex escape" in why:
        try:
            found = find_surrogate(json.loads(body))
        except (ValueError, RecursionError):
            found = None
        if found is not None:
            return InvalidUnicode(*found)
    return InvalidJSON(why)


def _parse_piecewise(text: str) -> Any:
    value, end = _value(text, _skip(text, 0), 0)
    if _skip(text, end) != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    """The value at `i`: containers down to PIECEWISE_DEPTH member by member, the rest whole."""
    opener = text[i : i + 1]
    if depth >= PIECEWISE_DEPTH or opener not in ("[", "{"):
        value, end = _decoder.raw_decode(text, i)
        return _check_nesting(text, i, end, value, depth), end
    if depth > 0:
        # Most containers are small: one C call on a bounded slice (it fails unless the
        # container ends inside the slice, so its cost is bounded either way).
        try:
            value, end = _decoder.raw_decode(text[i : i + SMALL_CHARS])
        except ValueError:
            pass
        else:
            return _check_nesting(text, i, i + end, value, depth), i + end
    closer = "]" if opener == "[" else "}"
    items: list[Any] = []
    members: dict[str, Any] = {}
    i = _skip(text, i + 1)
    if text.startswith(closer, i):
        return (items if opener == "[" else members), i + 1
    while True:
        if opener == "{":
            key, i = _decoder.raw_decode(text, i)
            i = _skip(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                raise json.JSONDecodeError("Expecting a string key and ':'", text, i)
            members[key], i = _value(text, _skip(text, i + 1), depth + 1)
        elif (run := _INT_RUN.match(text, i)) is not None:
            # Token ids: integers in batches (an integer holds no comma, so the run is exact).
            items.extend(json.loads("[" + run.group() + "]"))
            i = run.end()
        else:
            item, i = _value(text, i, depth + 1)
            items.append(item)
        i = _skip(text, i)
        if text.startswith(closer, i):
            return (items if opener == "[" else members), i + 1
        if not text.startswith(",", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _skip(text, i + 1)


def _check_nesting(text: str, start: int, end: int, value: Any, depth: int) -> Any:
    """`value` (parsed from text[start:end] at `depth`) unless nested past MAX_NESTING."""
    room = MAX_NESTING - depth
    # Cheap filter (C speed): a piece with fewer brackets than the room left cannot be too deep.
    if text.count("[", start, end) + text.count("{", start, end) <= room:
        return value
    deepest, stack = 0, [(value, 1)]
    while stack:  # iterative: the walk itself must not recurse
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > room:
            raise InvalidJSON(f"recursion limit exceeded: arrays and objects nested more than {MAX_NESTING} "
                              f"deep (in the value at character {start})")
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return value


def find_surrogate(value: Any) -> tuple[str, str] | None:
    """(path as the client wrote it, the surrogate) of the first string holding one, or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if (m := _SURROGATE.search(node)) is not None:
                return path, m.group()
        elif isinstance(node, dict):
            children = []
            for key, child in node.items():
                where = f"{path}.{key}" if path else str(key)
                if (m := _SURROGATE.search(key)) is not None:
                    return where, m.group()
                children.append((where, child))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(node)]))
    return None
