"""The JSON-Schema byte grammar: sound (random walks give valid JSON that validates),
complete on the instances it is meant to write, exact about free strings, and states that
mean the same position are equal."""

from __future__ import annotations

import codecs
import json
import random
import time

import pytest
from grammar_support import CASES, Case, Rows, instance, layouts, random_walk  # tests/structured/conftest.py
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemoe.structured import FREE_STRING_BYTES, Grammar
from edgemoe.structured.matcher import UNBOUNDED_ROOM

WALKS = 48


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_random_walks_are_valid(case: Case) -> None:
    """Every walk ends in JSON that parses and validates; every state on the way has an
    allowed byte or is complete, and can_continue/free_string say so exactly (Rows.check)."""
    rows = Rows(case.get())
    validator = case.validator()
    for seed in range(WALKS):
        text = random_walk(rows, random.Random(f"{case.name}/{seed}"), uniform=seed % 4 == 3)
        value = json.loads(text.decode("utf-8", errors="replace"))
        assert validator.is_valid(value), (text, value)


DEEP = [("tree", b'{"v":1,"kids":[' * 62), ("empty", b'[{"k":' * 63), ("json_object", b'{"a":[' * 63),
        ("ambiguous_nesting", b'{"child":' * 125), ("linked_list", b'{"val":1,"next":' * 125),
        ("array_union", b"[[]")]


@pytest.mark.parametrize("name,prefix", DEEP, ids=[d[0] for d in DEEP])
def test_random_walks_near_the_nesting_limit(name: str, prefix: bytes) -> None:
    """Close to MAX_NESTING (128) only what still fits is offered: still no dead end."""
    case = next(c for c in CASES if c.name == name)
    rows = Rows(case.get())
    validator = case.validator()
    for seed in range(16):
        text = random_walk(rows, random.Random(f"deep/{name}/{seed}"), prefix=prefix, uniform=seed % 2 == 1)
        assert validator.is_valid(json.loads(text.decode("utf-8", errors="replace"))), text[-200:]


def test_nesting_limit_is_exact() -> None:
    """A required chain may fill the 128 levels exactly; an optional one stops before."""
    g = Grammar.from_schema({"$defs": {"L": {"type": "array", "items": {"$ref": "#/$defs/L"}}}, "$ref": "#/$defs/L"})
    full = g.advance_bytes(g.start(), b"[" * 128)
    assert full is not None and g.advance(full, ord("[")) is None
    assert g.advance_bytes(full, b"]" * 128) is not None
    t = Grammar.from_schema(TREE_REQUIRED)
    s = t.advance_bytes(t.start(), b'{"k":[' * 63 + b'{"k":[')  # 128 levels: this array must be empty
    assert s is not None and t.advance(s, ord("{")) is None and t.advance(s, ord("]")) is not None
    s = t.advance_bytes(t.start(), b'{"k":[' * 63 + b'{"k":[],')  # no room for a sibling either
    assert s is None


TREE_REQUIRED = {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#"}}},
                 "required": ["k"], "additionalProperties": False}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_instances_are_accepted(case: Case) -> None:
    """Valid instances written in declared order are accepted byte by byte, compact, with
    default separators and indented (where the case's literals allow each layout)."""
    g = case.get()
    validator = case.validator()
    root = case.schema
    for seed in range(10):
        value = instance(root, random.Random(seed), root)
        assert validator.is_valid(value), value
        for text in layouts(case, value):
            state = g.advance_bytes(g.start(), text.encode())
            assert state is not None and g.is_complete(state), text


@settings(max_examples=150, deadline=None)
@given(st.text(), st.integers(min_value=-10**19, max_value=10**19),
       st.floats(allow_nan=False, allow_infinity=False, min_value=-1e99, max_value=1e99))
def test_scalars_from_hypothesis(text: str, whole: int, real: float) -> None:
    """Any str (escapes, surrogate pairs) in both encodings, any integer and double."""
    g = _SCALARS
    value = {"s": text, "i": whole, "f": real if abs(real) > 1e-90 or real == 0 else 0.0, "b": text[:3]}
    for ascii_ in (True, False):
        raw = json.dumps(value, ensure_ascii=ascii_).encode()
        state = g.advance_bytes(g.start(), raw)
        assert state is not None and g.is_complete(state), raw


_SCALARS = Grammar.from_schema({"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "f": {"type": "number"},
    "b": {"type": "string", "maxLength": 3}}, "required": ["s", "i", "f", "b"]})


def test_top_level_number_completes_and_continues() -> None:
    g = Grammar.from_schema({"type": "number"})
    s = g.advance_bytes(g.start(), b"12")
    assert s is not None and g.is_complete(s) and g.can_continue(s)
    s = g.advance_bytes(g.start(), b"-")
    assert s is not None and not g.is_complete(s)
    gi = Grammar.from_schema({"type": "integer"})
    s = gi.advance_bytes(gi.start(), b"0")
    assert s is not None and gi.is_complete(s) and not gi.can_continue(s)
    s = gi.advance_bytes(gi.start(), b"9" * 20)
    assert s is not None and gi.is_complete(s) and not gi.can_continue(s)
    s = g.advance_bytes(g.start(), b"1e99")
    assert s is not None and g.is_complete(s) and not g.can_continue(s)
    s = g.advance_bytes(g.start(), b'{"a":1}'[:0] + b"true"[:0] + b"3")
    assert s is not None and g.is_complete(s)


def test_closed_values_cannot_continue() -> None:
    for schema, text in [({"type": "object"}, b"{}"), ({"type": "string"}, b'"a"'),
                         ({"type": "boolean"}, b"true"), ({"type": "array"}, b"[1]"),
                         ({"enum": [1, 12]}, b"12"), ({"type": "null"}, b"null")]:
        g = Grammar.from_schema(schema)
        s = g.advance_bytes(g.start(), text)
        assert s is not None and g.is_complete(s) and not g.can_continue(s), text
    g = Grammar.from_schema({"enum": [1, 12]})
    s = g.advance_bytes(g.start(), b"1")
    assert s is not None and g.is_complete(s) and g.can_continue(s)


# --- free strings ---------------------------------------------------------------------------

FREE_AT = [
    ({"type": "object", "properties": {"name": {"type": "string"}}}, b'{"name":"ab'),
    ({"type": "object", "properties": {"name": {"type": "string"}}}, b'{"name":"a\\n\\u00e9\\ud83d\\ude00'),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, b'{"ke'),
    ({}, b'[{"x":["'),
    ({"anyOf": [{"type": "string"}, {"type": "string", "format": "date"}]}, b'"x'),
    ("json_object", b'{"a":"'),
]
NOT_FREE_AT = [
    ({"type": "string", "minLength": 2}, b'"\xc3\xa9b'),  # bounded strings validate UTF-8 throughout
    ({"type": "string", "maxLength": 5}, b'"ab'),
    ({"type": "string", "minLength": 3}, b'"ab'),
    ({"type": "string", "minLength": 1}, b'"\xc3'),  # a UTF-8 sequence half read
    ({"enum": ["abc", "abd"]}, b'"ab'),
    ({"const": "abc"}, b'"'),
    ({"type": "string"}, b'"a\\'),
    ({"type": "string"}, b'"a\\u12'),
    ({"type": "string"}, b'"\\ud83d'),
    ({"anyOf": [{"type": "string"}, {"enum": ["abc"]}]}, b'"ab'),
    ({"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 9}]}, b'"ab'),
    ({"type": "object", "properties": {"name": {"type": "string"}}}, b'{"na'),  # a declared key
    ({"type": "string"}, b'"ab"'),
    ({"type": "number"}, b"1"),
]


def _grammar(schema: object) -> Grammar:
    return Grammar.json_object() if schema == "json_object" else Grammar.from_schema(schema)


@pytest.mark.parametrize("schema,text", FREE_AT)
def test_free_string_states_are_fixed_points(schema: object, text: bytes) -> None:
    g = _grammar(schema)
    s = g.advance_bytes(g.start(), text)
    assert s is not None and g.free_string(s)
    assert FREE_STRING_BYTES == frozenset(range(0x20, 0x100)) - {0x22, 0x5C}
    for b in FREE_STRING_BYTES:
        assert g.advance(s, b) is s  # equal, and (between memo resets) the very same object
    rng = random.Random(0)
    run = bytes(rng.choice(sorted(FREE_STRING_BYTES)) for _ in range(200))
    assert g.advance_bytes(s, run) == s


@pytest.mark.parametrize("schema,text", NOT_FREE_AT)
def test_constrained_states_are_not_free(schema: object, text: bytes) -> None:
    g = _grammar(schema)
    s = g.advance_bytes(g.start(), text)
    assert s is not None and not g.free_string(s)
    assert any(g.advance(s, b) != s for b in FREE_STRING_BYTES)


ROOM_AT = [
    ({"type": "string", "maxLength": 3}, b'"', 3),
    ({"type": "string", "maxLength": 3}, b'"\xc3\xa9', 2),
    ({"type": "string", "maxLength": 3}, b'"a\\nb', 0),
    ({"type": "string", "minLength": 2}, b'"', UNBOUNDED_ROOM),
    ({"type": "string", "minLength": 2}, b'"abc', UNBOUNDED_ROOM),
    ({"type": "string", "minLength": 1, "maxLength": 5}, b'"\xf0\x9f\x98\x80', 4),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "maxLength": 4}]}, b'"a', 3),
]
NO_ROOM_AT = [
    ({"type": "string", "maxLength": 3}, b'"\xc3'),  # mid-character
    ({"type": "string", "maxLength": 3}, b'"\\u00'),  # mid-escape
    ({"type": "string"}, b'"a'),  # free: see free_string
    ({"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 4}]}, b'"a'),
    ({"anyOf": [{"enum": ["ab"]}, {"type": "string", "maxLength": 4}]}, b'"a'),
    ({"type": "string", "maxLength": 3}, b'"a"'),
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 9}}}, b'{"na'),
]


def _utf8_chars(data: bytes) -> int | None:
    """Characters in `data` if it is valid UTF-8 or a valid prefix (Python's strict decoder:
    no overlong forms, no surrogates), else None."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return None
    return len(text) + (1 if decoder.getstate()[0] else 0)


@pytest.mark.parametrize("schema,text,room", ROOM_AT)
def test_string_room_is_exact(schema: object, text: bytes, room: int) -> None:
    """From a state with room r, a run of free bytes is accepted iff it is valid UTF-8
    (or a prefix) of at most r characters."""
    g = _grammar(schema)
    s = g.advance_bytes(g.start(), text)
    assert s is not None and not g.free_string(s) and g.string_room(s) == room
    rng = random.Random(room)
    pieces = [b"a", b" ", b"~", "é".encode(), "中".encode(), "😀".encode(), b"\x80", b"\xbf", b"\xc0\x80",
              b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\xe4", b"\xe4\xb8"]
    for _ in range(400):
        run = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        chars = _utf8_chars(run)
        want = chars is not None and chars <= room
        assert (g.advance_bytes(s, run) is not None) == want, run


@pytest.mark.parametrize("schema,text", NO_ROOM_AT)
def test_string_room_none_elsewhere(schema: object, text: bytes) -> None:
    g = _grammar(schema)
    s = g.advance_bytes(g.start(), text)
    assert s is not None and g.string_room(s) is None


# --- equal positions, equal states -----------------------------------------------------------

def test_same_position_same_state() -> None:
    g = Grammar.from_schema(CASES[0].schema)  # flat: id, name, score, ok, note, tag
    a = g.advance_bytes(g.start(), b'{"id":1,"name":"x')
    b = g.advance_bytes(g.start(), b'{"id":  23,"name":"\\"\xe4\xb8\xad yz')
    assert a is not None and a == b and hash(a) == hash(b)
    c = Grammar.from_schema({"type": "array", "items": {"type": "string"}})
    assert c.advance_bytes(c.start(), b'["a","b"') == c.advance_bytes(c.start(), b'["a","b","c","d"')
    assert c.advance_bytes(c.start(), b'["a"') != c.advance_bytes(c.start(), b'["a",')
    # the key of an optional-chain property, reached after different earlier properties
    o = Grammar.from_schema({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                              "c": {"type": "integer"}}})
    assert o.advance_bytes(o.start(), b'{"c') == o.advance_bytes(o.start(), b'{"a":1,"c')
    m = Grammar.from_schema({"type": "string", "minLength": 2})
    assert m.advance_bytes(m.start(), b'"ab') == m.advance_bytes(m.start(), b'"abcdef')


def test_nested_ambiguity_stays_small() -> None:
    """anyOf alternatives that nest alike share one thread per top frame (their parents
    merge), so the state does not double per level; the outer choice still holds."""
    g = next(c for c in CASES if c.name == "ambiguous_nesting").get()
    s = g.advance_bytes(g.start(), b'{"child":' * 40)
    assert s is not None and len(s) <= 2
    closing = b'{"kind":"a"}' + b',"kind":"b"}' * 39 + b',"kind":"a"}'
    done = g.advance_bytes(s, closing)
    assert done is not None and g.is_complete(done)
    assert g.advance_bytes(s, b'{"kind":"c"') is None


@pytest.mark.timeout(60)
def test_equal_deep_states_compare_fast_across_memo_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo and state table start over now and then; states built before and after
    still compare equal, and cheaply (no walk over every path of the stack graph)."""
    from edgemoe.structured import matcher

    monkeypatch.setattr(matcher, "MEMO_LIMIT", 500)
    g = next(c for c in CASES if c.name == "ambiguous_nesting").get()
    text = b'{"child":' * 100 + b'{"kind":"a"'
    before = g.advance_bytes(g.start(), text)
    for _ in range(3):
        for b in range(256):
            g.advance(before, b)  # enough new results to reset the memo
        after = g.advance_bytes(g.start(), text)
        assert after == before and hash(after) == hash(before)


def test_states_are_hashable_and_immutable() -> None:
    g = Grammar.from_schema(CASES[4].schema)  # tree
    s = g.advance_bytes(g.start(), b'{"v":1,"kids":[{"v":2,"kids":[')
    assert s is not None
    assert {s: 1}[g.advance_bytes(g.start(), b'{"v":1,"kids":[{"v":2,"kids":[')] == 1
    s2 = g.advance(s, ord("]"))
    assert s2 is not None and s2 != s and g.advance_bytes(g.start(), b'{"v":1,"kids":[{"v":2,"kids":[') == s


def test_advance_rate() -> None:
    """Prints advance() calls per second (a measurement, not asserted)."""
    g = Grammar.from_schema(CASES[18].schema)  # pydantic
    texts = {"after {": b"{", "in string": b'{"name":"ab', "in key": b'{"na', "in number": b'{"name":"a","age":12'}
    for label, text in texts.items():
        fresh = Grammar.from_schema(CASES[18].schema)
        s = fresh.advance_bytes(fresh.start(), text)
        t0 = time.perf_counter()
        for _ in range(40):
            fresh._memo.clear()
            for b in range(256):
                fresh.advance(s, b)
        cold = 40 * 256 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(40):
            for b in range(256):
                fresh.advance(s, b)
        warm = 40 * 256 / (time.perf_counter() - t0)
        print(f"advance {label}: {cold:,.0f}/s computed, {warm:,.0f}/s memoised")
    assert g is not None
