"""Strings held to `pattern` and known `format`s (with minLength / maxLength beside them or
not): the grammar takes a string exactly where
an independent validator (jsonschema_rs, formats validated) does, among the strings the
pattern leaf writes (printable ASCII, no escapes); random walks never dead-end and always
validate; patterns outside the subset and conflicting allOf patterns stay unenforced; the
token masks over Qwen3's vocabulary equal brute force along an instance."""

from __future__ import annotations

import json
import random

import jsonschema_rs
import pytest
from grammar_support import Rows, random_walk
from mask_support import states_checked_along

from edgemoe.structured import Grammar, GrammarError
from edgemoe.structured.pattern_string import FORMATS
from edgemoe.structured.regex import ALPHABET

PATTERNS = [
    r"^[A-Z]{3}-\d{2,4}$",
    r"abc",  # unanchored: anywhere
    r"^(red|green|blue)(-[a-z]+)?$",
    r"^\w+@\w+\.(com|org)$",
    r"^[^aeiou ]*$",
    r"^a.c$",
    r"^(ab|a)(bc|c)?x$",
    r"^(?:[0-9a-f]{2}:){2}[0-9a-f]{2}$",
    r"^\$\d+(\.\d\d)?$",
    r"^x*?y+?$",  # lazy quantifiers: the same language
    r"^[\w.-]+$",
]
ALPHA = "".join(chr(c) for c in sorted(ALPHABET))


def writable(text: str) -> bool:
    return all(ord(c) in ALPHABET for c in text)


def complete(grammar: Grammar, text: str) -> bool:
    state = grammar.advance_bytes(grammar.start(), json.dumps(text).encode())
    return state is not None and grammar.is_complete(state)


def samples(rows: Rows, rng: random.Random, n: int, prefix: bytes = b"") -> list[str]:
    return [json.loads(random_walk(rows, rng, soft=30, prefix=prefix)) for _ in range(n)]


@pytest.mark.parametrize("index", range(len(PATTERNS)))
def test_pattern_taken_exactly_where_valid(index: int) -> None:
    schema = {"type": "string", "pattern": PATTERNS[index]}
    grammar, check, rng = Grammar.from_schema(schema), jsonschema_rs.validator_for(schema), random.Random(index)
    # Rows.check: no state is a dead end (an unanchored pattern's walk starts past a match,
    # which a random walk would rarely write)
    made = samples(Rows(grammar), rng, 40, b'"zabc' if PATTERNS[index] == "abc" else b"")
    assert all(check.is_valid(s) for s in made), made
    mutated = [s[:i] + rng.choice(ALPHA + "é\"\\") + s[i + 1:] for s in made for i in range(min(len(s), 3))]
    noise = ["".join(rng.choice(ALPHA) for _ in range(rng.randint(0, 8))) for _ in range(300)]
    for text in made + mutated + noise + ["", "abc", "ABC-123", "red-x", "a@b.com", "$12.50", "xyy", "0a:1b:2c"]:
        assert complete(grammar, text) == (writable(text) and check.is_valid(text)), (PATTERNS[index], text)


@pytest.mark.parametrize("pattern, lo, hi", [
    (r"^[a-z]+$", 3, 5), (r"^(ab)+$", 3, None), (r"^[A-Z]{3}-\d{2,4}$", 0, 7), (r"abc", 5, 8),
    (r"^x*$", 2, 2), (r"^\w+@\w+\.(com|org)$", 9, None),
])
def test_pattern_with_lengths(pattern: str, lo: int, hi: int | None) -> None:
    schema = {"type": "string", "pattern": pattern, "minLength": lo, **({} if hi is None else {"maxLength": hi})}
    grammar, check, rng = Grammar.from_schema(schema), jsonschema_rs.validator_for(schema), random.Random(pattern)
    made = samples(Rows(grammar), rng, 30, b'"zabc' if pattern == "abc" else b"")
    assert all(check.is_valid(s) for s in made), made
    noise = ["".join(rng.choice("abcxzAB@.-12com") for _ in range(rng.randint(0, 12))) for _ in range(400)]
    for text in made + noise + ["abab", "ababa", "ABC-12", "ABC-1234", "xx", "zabcz", "a@b.com", "abc@de.org"]:
        assert complete(grammar, text) == (writable(text) and check.is_valid(text)), (schema, text)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_formats_write_only_valid_values(fmt: str) -> None:
    schema = {"type": "string", "format": fmt}
    grammar = Grammar.from_schema(schema)
    check = jsonschema_rs.validator_for(schema, validate_formats=True)
    for text in samples(Rows(grammar), random.Random(fmt), 60):
        assert check.is_valid(text), (fmt, text)
    assert not complete(grammar, "not a " + fmt)


def test_what_stays_unenforced() -> None:
    for schema in ({"type": "string", "pattern": r"(?=a)b"}, {"type": "string", "pattern": r"^(a)\1$"},
                   {"type": "string", "pattern": "(?<name"},  # an unclosed group name (was a ValueError)
                   {"type": "string", "format": "color"}, {"type": "string", "pattern": "^é+$"},
                   {"type": "string", "format": "date", "maxLength": 5},  # no date fits: the lengths hold
                   {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}):
        assert complete(Grammar.from_schema(schema), "zz"), schema
    assert not complete(Grammar.from_schema({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "^a"}]}), "zz")


def test_enum_values_outside_the_pattern_are_dropped() -> None:
    grammar = Grammar.from_schema({"enum": ["abc", "xyz", 3], "pattern": "^a"})
    assert [v for v in ("abc", "xyz") if complete(grammar, v)] == ["abc"]


def test_masks_equal_brute_force_along_an_instance() -> None:
    schema = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"},
                                               "code": {"type": "string", "pattern": r"^[A-Z]{2}\d+$"}},
              "required": ["at", "code"]}
    states_checked_along(schema, '{"at": "2024-05-06T07:08:09.5+01:00", "code": "AB12"}')


def test_a_schemas_patterns_share_a_work_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the schema's budget a pattern goes unenforced there, and is not remembered so:
    alone it is enforced."""
    import edgemoe.structured.pattern_string as ps
    monkeypatch.setattr(ps, "SCHEMA_WORK", 3000)
    props = {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i + 1}}}q$"} for i in range(40)}
    grammar = Grammar.from_schema({"type": "object", "properties": props, "required": ["p39"]})
    state = grammar.advance_bytes(grammar.start(), b'{"p39": "zz"}')
    assert state is not None and grammar.is_complete(state)  # unenforced in this schema
    assert not complete(Grammar.from_schema(props["p39"]), "zz") and complete(Grammar.from_schema(props["p39"]), "a" * 40 + "q")


NOT_REGEXES = ["([a-", "a{5,2}", "*a", "a**", "[z-a]", "abc\\", "(a", "a)", "{2}", "a???"]


@pytest.mark.parametrize("pattern", NOT_REGEXES)
def test_a_pattern_that_is_no_regex_is_refused_naming_it(pattern: str) -> None:
    """These were accepted and silently left unenforced; an independent validator refuses
    them as schemas too (ECMA-262 has no such regex)."""
    with pytest.raises(ValueError):
        jsonschema_rs.validator_for({"type": "string", "pattern": pattern})
    for schema, where in (({"type": "string", "pattern": pattern}, "pattern"),
                          ({"properties": {"a": {"pattern": pattern}}}, "properties.a.pattern"),
                          ({"allOf": [{"pattern": "^a"}, {"pattern": pattern}]}, "allOf.1.pattern")):
        with pytest.raises(GrammarError, match="not a regular expression") as err:
            Grammar.from_schema(schema)
        assert err.value.path == where


@pytest.mark.parametrize("schema", [{"type": "string", "pattern": 5}, {"type": "string", "format": ["date"]},
                                    {"enum": ["a"], "pattern": None}])
def test_a_pattern_or_format_that_is_no_string_is_refused(schema: dict) -> None:
    with pytest.raises(GrammarError, match="must be a string"):
        Grammar.from_schema(schema)
