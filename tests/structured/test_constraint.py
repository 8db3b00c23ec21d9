"""One request's constraint over Qwen3's vocabulary: where the JSON starts (after the
think block, or at once), EOS only where the value is complete, whitespace before the
value, and a token the mask refused ending the constraint rather than the request."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from mask_support import qwen_vocab

from edgemoe.structured import Grammar
from edgemoe.structured.constraint import LEAD_SPACE, PaddedValue, OutputConstraint, ThinkTokens
from edgemoe.structured.token_masks import TokenMasks

EOS = 151645  # <|im_end|>
THINK = ThinkTokens(151667, 151668)  # <think>, </think> in Qwen3's added tokens


def constraint(reasoning: str, schema: object = None) -> tuple[OutputConstraint, list[bytes | None]]:
    token_bytes, vocab = qwen_vocab()
    grammar = Grammar.json_object() if schema is None else Grammar.from_schema(schema)
    masks = TokenMasks(PaddedValue(grammar), vocab)
    return OutputConstraint(masks, token_bytes, frozenset({EOS}), reasoning, THINK), token_bytes  # type: ignore[arg-type]


def tok(token_bytes: list[bytes | None], text: bytes) -> int:
    return token_bytes.index(text)


def test_think_tokens_are_qwen3s() -> None:
    from tokenizers import Tokenizer

    from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
    t = Tokenizer.from_file(str(qwen3_tokenizer_json()))
    assert (t.token_to_id("<think>"), t.token_to_id("</think>"), t.token_to_id("<|im_end|>")) == (THINK.open, THINK.close, EOS)


def test_start_allows_a_think_block_first() -> None:
    c, tb = constraint("start")
    first = c.mask()
    assert first is not None and first[THINK.open] and first[tok(tb, b"{")] and not first[THINK.close]
    assert not first[EOS]
    c.accept(THINK.open)
    assert c.mask() is None  # reasoning is free
    c.accept(tok(tb, b"hello"))
    c.accept(THINK.close)
    after = c.mask()
    assert after is not None and after[tok(tb, b"\n\n")] and after[tok(tb, b"{")] and not after[THINK.open]


def test_start_allows_whitespace_before_the_think_block() -> None:
    """GLM-4.5 writes "\n<think>" after its generation prompt: the newline is the JSON's
    leading space or the think block's lead, both still possible."""
    c, tb = constraint("start")
    c.accept(tok(tb, b"\n"))
    m = c.mask()
    assert m is not None and m[THINK.open] and m[tok(tb, b"{")]
    c.accept(THINK.open)
    assert c.phase == "thinking" and c.mask() is None
    c.accept(THINK.close)
    after = c.mask()
    assert after is not None and after[tok(tb, b"{")] and not after[THINK.open]
    c2, _ = constraint("start")
    c2.accept(tok(tb, b"\n"))
    c2.accept(tok(tb, b"{"))
    m2 = c2.mask()
    assert m2 is not None and not m2[THINK.open]  # the value began: no think block any more


def test_start_without_think_constrains_the_first_token() -> None:
    c, tb = constraint("start")
    c.accept(tok(tb, b"{"))
    m = c.mask()
    assert m is not None and not m[THINK.open] and m[tok(tb, b'"')] and m[tok(tb, b"}")]


def test_open_waits_for_the_close_tag() -> None:
    c, tb = constraint("open")
    assert c.mask() is None
    c.accept(tok(tb, b"{"))  # inside the think block: anything
    assert c.mask() is None
    c.accept(THINK.close)
    assert c.mask() is not None


def test_eos_exactly_where_complete() -> None:
    c, tb = constraint("none", {"type": "array", "items": {"type": "integer"}})
    for piece in (b"[", b"1", b","):
        c.accept(tok(tb, piece))
        assert not c.mask()[EOS]  # type: ignore[index]
    c.accept(tok(tb, b"2"))
    c.accept(tok(tb, b"]"))
    m = c.mask()
    assert m is not None and m[EOS]
    # Nothing but whitespace (at most LEAD_SPACE bytes) may follow a closed array.
    spaces = {t for t, b in enumerate(tb) if b and len(b) <= LEAD_SPACE and not b.strip(b" \t\n\r")}
    assert set(np.flatnonzero(m)) == spaces | {EOS} and len(spaces) > 20


def test_trailing_space_is_bounded_and_ends_in_eos() -> None:
    c, tb = constraint("none", {"type": "integer"})
    c.accept(tok(tb, b"1"))  # Qwen's digits are single tokens
    c.accept(tok(tb, b"2"))
    m = c.mask()
    assert m is not None and m[EOS] and m[tok(tb, b"3")] and m[tok(tb, b"\n")]  # 123 or 12 then space
    newline = tok(tb, b"\n")
    for _ in range(LEAD_SPACE):
        assert c.mask()[newline] and c.mask()[EOS]  # type: ignore[index]
        c.accept(newline)
    m = c.mask()
    assert m is not None and set(np.flatnonzero(m)) == {EOS}  # no digit after the space, no ninth byte


def test_leading_space_is_bounded() -> None:
    c, tb = constraint("none")
    space = tok(tb, b" ")
    for _ in range(LEAD_SPACE):
        assert c.mask()[space]  # type: ignore[index]
        c.accept(space)
    assert not c.mask()[space]  # type: ignore[index]


def test_a_refused_token_ends_the_constraint(caplog: pytest.LogCaptureFixture) -> None:
    c, tb = constraint("none")
    with caplog.at_level(logging.WARNING):
        c.accept(tok(tb, b"hello"))
    assert c.mask() is None and "not allowed" in caplog.text


def test_special_and_added_tokens_never_allowed_in_the_value() -> None:
    c, tb = constraint("none", {"type": "string"})
    c.accept(tok(tb, b'"'))
    m = c.mask()
    assert m is not None
    added = [t for t, b in enumerate(tb) if b is None]
    assert len(added) > 20 and not m[added].any() and not m[len(tb):].any()
    assert np.count_nonzero(m) > 140_000  # the free string takes almost every token
