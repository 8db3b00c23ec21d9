"""Numbers held to minimum / maximum / exclusiveMinimum / exclusiveMaximum / multipleOf: the grammar
takes a number exactly where an independent validator (jsonschema_rs) does, among the
texts the bounded leaf writes (no exponent, no "-0", digit runs capped); no state is a
dead end; bounds meet through allOf; impossible ranges are pruned or refused; the token
masks over Qwen3's vocabulary equal brute force along an instance."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction

import jsonschema_rs
import pytest
from grammar_support import Rows, random_walk
from mask_support import states_checked_along

from edgemoe.structured import Grammar, GrammarError

RANGES = [
    {"type": "integer", "minimum": 0, "maximum": 100},
    {"type": "integer", "exclusiveMinimum": 0},
    {"type": "integer", "minimum": -25, "exclusiveMaximum": 7},
    {"type": "integer", "maximum": -3},
    {"type": "number", "minimum": -1.5, "maximum": 2.25},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    {"type": "number", "minimum": 0.1},
    {"type": "number", "maximum": -0.05},
    {"type": "number", "minimum": 5, "exclusiveMinimum": True},  # draft 4's flag
    {"type": "number", "minimum": 2, "maximum": 2},
    {"type": "integer", "minimum": 1e3, "maximum": 12345.0},  # integral floats as bounds
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 2e-20},  # one 20-digit decimal
    {"type": "integer", "multipleOf": 7},  # multipleOf: steps a double divides exactly (the validator divides doubles)
    {"type": "integer", "multipleOf": 3, "minimum": -20, "exclusiveMaximum": 40},
    {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -2, "maximum": 3.5},
    {"type": "number", "multipleOf": 2.5},
    {"type": "integer", "multipleOf": 0.5, "maximum": 9},  # every integer
    {"type": "number", "multipleOf": 125, "minimum": 900, "maximum": 1000},  # one value
]
SYNTAX = re.compile(r"-?(0|[1-9][0-9]{0,19})(\.[0-9]{1,20})?")


def validator(schema: dict) -> object:
    """Draft 4's validator where its boolean exclusive flags are used."""
    draft4 = any(isinstance(v, bool) for v in (schema.get("items", schema)).values())
    return jsonschema_rs.Draft4Validator(schema) if draft4 else jsonschema_rs.validator_for(schema)


def candidates(rng: random.Random) -> list[str]:
    out = [str(i) for i in range(-320, 321)] + [f"{i / 20:.2f}" for i in range(-120, 121)]
    out += [f"{i / 10:.1f}" for i in range(-60, 61)] + ["-0", "-0.0", "00", "01", "1.", ".5", "-", "1e2", "2.0e0",
                                                         "0.05", "-0.05", "-0.049", "12345", "12346", "999", "1000",
                                                         "99999999999999999999", "0." + "0" * 19 + "1"]
    out += [f"{rng.uniform(-1e4, 1e4):.{rng.randint(0, 4)}f}" for _ in range(300)]
    return out


def complete(grammar: Grammar, text: str) -> bool:
    state = grammar.advance_bytes(grammar.start(), text.encode())
    return state is not None and grammar.is_complete(state)


@pytest.mark.parametrize("index", range(len(RANGES)))
def test_taken_exactly_where_valid(index: int) -> None:
    schema = RANGES[index]
    grammar, check = Grammar.from_schema(schema), validator(schema)
    taken = 0
    for text in candidates(random.Random(index)):
        writable = bool(SYNTAX.fullmatch(text)) and not re.fullmatch(r"-0(\.0*)?", text)
        writable = writable and ("." not in text or schema["type"] == "number")  # integers: no fraction
        want = writable and check.is_valid(json.loads(text))  # type: ignore[attr-defined]
        assert complete(grammar, text) == want, (schema, text)
        taken += want
    assert taken >= 1


@pytest.mark.parametrize("index", range(len(RANGES)))
def test_random_walks_end_in_valid_numbers(index: int) -> None:
    """Rows.check asserts every visited state's contract (no dead end) on the way. The
    multiple is checked in exact decimals: past 2**53 a double no longer holds the text's
    value (…195.0 reads as …196.0)."""
    items = RANGES[index]
    schema = {"type": "array", "items": items, "maxItems": 6}
    rows, rng = Rows(Grammar.from_schema(schema)), random.Random(index)
    check = validator({**schema, "items": {k: v for k, v in items.items() if k != "multipleOf"}})
    step = Fraction(str(items["multipleOf"])) if "multipleOf" in items else None
    for _ in range(30):
        text = random_walk(rows, rng, soft=40)
        assert check.is_valid(json.loads(text))  # type: ignore[attr-defined]
        exact = json.loads(text, parse_float=Fraction, parse_int=Fraction)
        assert step is None or all((v / step).denominator == 1 for v in exact), text


def test_bounds_meet_through_all_of_and_prune_alternatives() -> None:
    merged = Grammar.from_schema({"allOf": [{"type": "integer", "minimum": 3},
                                            {"minimum": 5, "exclusiveMaximum": 8}, {"maximum": 9}]})
    assert [t for t in map(str, range(0, 12)) if complete(merged, t)] == ["5", "6", "7"]
    either = Grammar.from_schema({"anyOf": [{"type": "integer", "minimum": 3, "maximum": 2.5}, {"type": "string"}]})
    assert complete(either, '"x"') and not complete(either, "3")
    enum = Grammar.from_schema({"enum": [1, 5, 10.5, "a"], "minimum": 3})
    assert [t for t in ("1", "5", "10.5", '"a"') if complete(enum, t)] == ["5", "10.5", '"a"']


def test_an_empty_range_drops_only_its_type() -> None:
    assert complete(Grammar.from_schema({"type": ["integer", "string"], "minimum": 0.5, "maximum": 0.7}), '"x"')
    nullable = Grammar.from_schema({"type": "integer", "minimum": 0.5, "maximum": 0.7, "nullable": True})
    assert complete(nullable, "null") and not complete(nullable, "0")


def test_draft4_flags_stay_with_their_part_through_all_of() -> None:
    """`{minimum 1, exclusiveMinimum true}` and `{minimum 3}`: 3 is valid (Draft 4)."""
    low = Grammar.from_schema({"type": "integer", "allOf": [{"minimum": 1, "exclusiveMinimum": True}, {"minimum": 3}]})
    high = Grammar.from_schema({"type": "integer", "allOf": [{"maximum": 10, "exclusiveMaximum": True},
                                                             {"maximum": 50}]})
    assert complete(low, "3") and not complete(low, "2") and complete(high, "9") and not complete(high, "10")


@pytest.mark.parametrize("schema, where", [
    ({"type": "number", "minimum": 1e-25, "maximum": 2e-25}, "no number"),  # between two 20-digit decimals
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-20}, "no number"),
    ({"type": "integer", "minimum": 0.5, "maximum": 0.7}, "no integer"),
    ({"type": "number", "minimum": 1e30}, "no number"),
    ({"type": "number", "minimum": "3"}, "minimum must be a number"),
    ({"type": "object", "properties": {"a": {"type": "number", "maximum": True}}}, "properties.a.maximum"),
    ({"allOf": [{"type": "number", "minimum": "1"}, {"minimum": 2}]}, "minimum"),
])
def test_impossible_or_malformed_bounds_are_refused(schema: object, where: str) -> None:
    with pytest.raises(GrammarError, match=where):
        Grammar.from_schema(schema)


def test_multiple_of_is_exact_decimal_and_meets_through_all_of() -> None:
    """0.3 is a multiple of 0.1 (exact decimals; a double's division says 2.9999…); two
    parts' steps meet at their least common multiple; no multiple in range is refused."""
    tenths = Grammar.from_schema({"type": "number", "multipleOf": 0.1, "minimum": 0, "maximum": 0.35})
    assert [t for t in ("0.3", "0.30", "0.35", "0.31", "0.1", "0", "0.4") if complete(tenths, t)] == [
        "0.3", "0.30", "0.1", "0"]
    both = Grammar.from_schema({"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]})
    assert [t for t in map(str, range(-13, 40)) if complete(both, t)] == ["-12", "0", "12", "24", "36"]
    assert complete(Grammar.from_schema({"enum": [3, 4, 6], "multipleOf": 2}), "4")
    assert not complete(Grammar.from_schema({"enum": [3, 4, 6], "multipleOf": 2}), "3")
    with pytest.raises(GrammarError, match="no integer"):
        Grammar.from_schema({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9})
    with pytest.raises(GrammarError, match="multipleOf must be above 0"):
        Grammar.from_schema({"type": "number", "multipleOf": 0})


@pytest.mark.parametrize("schema", [{"type": "number", "exclusiveMaximum": 1}, {"type": "number", "exclusiveMinimum": 0.1},
                                    {"type": "number", "exclusiveMaximum": -2.5e-3, "exclusiveMinimum": -1}])
def test_exclusive_bounds_hold_for_a_client_reading_doubles(schema: dict) -> None:
    """A decimal just inside an exclusive bound may round to the bound in a double; the
    bound moves in to the halfway point to the adjacent double, so every number taken reads
    as a valid double, and one that rounds away from the bound is still taken."""
    grammar, check = Grammar.from_schema(schema), validator(schema)
    bound = Fraction(str(schema.get("exclusiveMaximum", schema.get("exclusiveMinimum"))))
    taken = 0
    for digits in range(12, 21):
        for d in range(-40, 41):
            x = bound + Fraction(d, 10**digits)
            text = ("-" if x < 0 else "") + f"{abs(x.numerator) * 10**digits // x.denominator:0{digits + 1}d}"
            text = text[:-digits] + "." + text[-digits:]
            if complete(grammar, text):
                taken += 1
                assert check.is_valid(json.loads(text)), text  # type: ignore[attr-defined]
    assert taken > 100
    assert complete(Grammar.from_schema({"type": "number", "exclusiveMaximum": 1}), "0.9999999999999999")  # rounds down
    assert not complete(Grammar.from_schema({"type": "number", "exclusiveMaximum": 1}), "0.99999999999999999999")


def test_exclusive_bounds_at_the_doubles_edges() -> None:
    """The halfway point is taken where it rounds away from the bound (2**53 + 1 is 2**53, a
    tie to even); bounds past the doubles or the 20 digits written stay as they are (the
    move overflowed: a 500)."""
    tie = Grammar.from_schema({"type": "number", "exclusiveMaximum": 9007199254740994})
    assert complete(tie, "9007199254740993") and not complete(tie, "9007199254740993.5")
    for bound in (1.7976931348623157e308, -1.7976931348623157e308, 10**400):
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            try:
                grammar = Grammar.from_schema({"anyOf": [{"type": "number", key: bound}, {"type": "string"}]})
            except GrammarError:
                continue
            assert complete(grammar, '"x"')


def test_masks_equal_brute_force_along_an_instance() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 250},
                                               "x": {"type": "number", "exclusiveMinimum": -1, "maximum": 0.5}},
              "required": ["n", "x"]}
    states_checked_along(schema, '{"n": 205, "x": -0.75}')
    stepped = {"type": "array", "items": {"type": "number", "multipleOf": 0.05, "maximum": 7}}
    states_checked_along(stepped, "[6.95, -12.3, 0]")
