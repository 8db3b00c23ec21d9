"""The token-mask walk against the plain definition: a token is allowed exactly when the
grammar accepts its bytes one by one from the state. Over Qwen3's real 151K vocabulary,
with a toy grammar (so the walk is tested apart from the JSON grammar) and with the JSON
grammar itself at states of several kinds."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from mask_support import brute_force, qwen_vocab, states_checked_along

from edgemoe.structured import FREE_STRING_BYTES, Grammar
from edgemoe.structured.constraint import PaddedValue
from edgemoe.structured.token_masks import TokenMasks


class Toy:
    """`"` free-string bytes `"` then digits, a closed language with a free-string part:
    states 0 (start), 1 (in the string), 2..(digits read + 2), at most 3 digits."""

    def advance(self, state: int, byte: int) -> int | None:
        if state == 0:
            return 1 if byte == 0x22 else None
        if state == 1:
            if byte == 0x22:
                return 2
            return 1 if byte in FREE_STRING_BYTES else None
        return state + 1 if 0x30 <= byte <= 0x39 and state < 5 else None

    def free_string(self, state: int) -> bool:
        return state == 1


@pytest.mark.parametrize("state", [0, 1, 2, 4, 5])
def test_toy_grammar_masks_equal_brute_force(state: int) -> None:
    token_bytes, vocab = qwen_vocab()
    got = TokenMasks(Toy(), vocab).allowed(state)
    want = brute_force(Toy(), state, token_bytes, vocab.width)
    assert got.shape == (vocab.width,)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:10]
    assert got.any() == (state != 5)  # 5: three digits read, the end


def _json_states(grammar: Grammar, text: str, count: int, seed: int) -> list[object]:
    """States part way through `text` (a valid instance), at random cut points."""
    data = text.encode()
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(len(data)), min(count, len(data))))
    states = []
    for cut in cuts:
        state = grammar.advance_bytes(grammar.start(), data[:cut])
        assert state is not None, data[:cut]
        states.append(state)
    return states


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tag": {"enum": ["alpha", "beta", 3]},
        "short": {"type": "string", "maxLength": 4},
        "items": {"type": "array", "items": {"type": "integer"}},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tag"],
}
INSTANCE = {"name": "Zoë \"q\" \\ x", "tag": "beta", "short": "ab", "items": [1, -20, 300], "ok": True}


@pytest.mark.parametrize("indent", [None, 2])
def test_json_grammar_masks_equal_brute_force(indent: int | None) -> None:
    token_bytes, vocab = qwen_vocab()
    grammar = Grammar.from_schema(SCHEMA)
    masks = TokenMasks(grammar, vocab)
    text = json.dumps(INSTANCE, ensure_ascii=False, indent=indent)
    for state in [grammar.start()] + _json_states(grammar, text, 6, seed=indent or 0):
        got = masks.allowed(state)
        want = brute_force(grammar, state, token_bytes, vocab.width)
        assert np.array_equal(got, want), (state, np.flatnonzero(got != want)[:10])


def test_leading_space_and_cache() -> None:
    token_bytes, vocab = qwen_vocab()
    lead = PaddedValue(Grammar.json_object())
    masks = TokenMasks(lead, vocab)
    start = lead.start()
    got = masks.allowed(start)
    assert np.array_equal(got, brute_force(lead, start, token_bytes, vocab.width))
    assert got[token_bytes.index(b"{")] and got[token_bytes.index(b"\n\n")]
    assert not got[token_bytes.index(b"[")]
    again = masks.allowed(start)
    assert masks.hits == 1 and np.array_equal(got, again)
    again[:] = False  # the cache hands out copies
    assert masks.allowed(start).any()


BOUNDED = {"type": "object", "required": ["name", "bio", "t"], "properties": {
    "name": {"type": "string", "maxLength": 3},
    "bio": {"type": "string", "minLength": 2, "maxLength": 40},
    "t": {"type": "string", "minLength": 3}}}
BOUNDED_TEXT = '{"name": "aé", "bio": "Zoë 中文 and \\"more\\" text", "t": "x\\u00e9yz"}'


def test_bounded_strings_masks_equal_brute_force() -> None:
    """Inside a string with minLength / maxLength the walk covers tokens by their
    character counts and UTF-8 validity (`Grammar.string_room`) instead of visiting them:
    exact at every position of an instance with multi-byte characters and escapes."""
    grammar = Grammar.from_schema(BOUNDED)
    states = states_checked_along(BOUNDED, BOUNDED_TEXT)
    assert sum(grammar.string_room(s) is not None for s in states) > 10  # the bounded shortcut was taken


@pytest.mark.parametrize("schema, text", [
    ({"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 10}]}, '"abcé'),
    ({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "string", "minLength": 1}]}}, '["a", "bc'),
])
def test_mixed_string_states_split_and_equal_brute_force(schema: object, text: str) -> None:
    """A state holding a free string and a bounded one (an anyOf) walks as its parts
    (Grammar.split), or-ed: each part is fast, the union exact."""
    grammar = Grammar.from_schema(schema)
    assert sum(len(grammar.split(s)) > 1 for s in states_checked_along(schema, text)) >= 3
