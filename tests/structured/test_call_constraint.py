"""One request's Hermes tool calls over Qwen3's vocabulary: free text, a call held to
the tools' schema from `<tool_call>` to `</tool_call>`, the template's own tokens allowed
all the way, reasoning left alone, and a forced call primed with its opening."""

from __future__ import annotations

import json
import logging
from functools import cache

import numpy as np
import pytest
from test_constraint import EOS, THINK
from mask_support import qwen_vocab
from tokenizers import Tokenizer

from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
from edgemoe.structured import Grammar
from edgemoe.structured.call_constraint import CallConstraint, CallRules
from edgemoe.structured.call_tokens import CallTags, CallTokens, SpaceTokens, SpelledTag
from edgemoe.structured.call_schema import call_schema
from edgemoe.structured.constraint import LEAD_SPACE, PaddedValue
from edgemoe.structured.token_masks import TokenMasks

TAGS = CallTags(151657, 151658)  # <tool_call>, </tool_call>
LIGHT = {"type": "object", "properties": {"on": {"type": "boolean"}, "room": {"enum": ["hall", "kitchen"]}},
         "required": ["on", "room"], "additionalProperties": False}
TOOLS = [("set_light", LIGHT), ("note", None)]


def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(qwen3_tokenizer_json()))


@cache
def call_tokens() -> CallTokens:
    token_bytes, vocab = qwen_vocab()
    return CallTokens(TAGS, SpaceTokens(token_bytes), SpelledTag(token_bytes, vocab.width))


def constraint(reasoning: str = "none", primed: bytes | None = None, one_call: bool = False,
               min_tokens: int = 0) -> CallConstraint:
    token_bytes, vocab = qwen_vocab()
    masks = TokenMasks(PaddedValue(Grammar.from_schema(call_schema(TOOLS))), vocab)
    rules = CallRules(frozenset({EOS}), one_call, min_tokens)
    return CallConstraint(masks, token_bytes, call_tokens(), rules, reasoning, THINK, primed)  # type: ignore[arg-type]


def spaces() -> set[int]:
    return {i for i, b in enumerate(qwen_vocab()[0]) if b and len(b) <= LEAD_SPACE and not b.strip(b" \t\n\r")}


def feed(c: CallConstraint, ids: list[int]) -> None:
    """Accept `ids`, each one allowed by the mask before it (None: unconstrained)."""
    for t in ids:
        m = c.mask()
        assert m is None or m[t], (t, tokenizer().decode([t], skip_special_tokens=False))
        c.accept(t)


def test_tags_are_qwen3s() -> None:
    t = tokenizer()
    assert (t.token_to_id("<tool_call>"), t.token_to_id("</tool_call>")) == (TAGS.open, TAGS.close)


def test_the_templates_call_passes_token_by_token() -> None:
    """Qwen's template's call, tokenized as the model saw it in training (`}}\\n` and all)."""
    call = {"name": "set_light", "arguments": {"on": True, "room": "kitchen"}}
    text = f"Sure.\n<tool_call>\n{json.dumps(call)}\n</tool_call>\n<tool_call>\n" \
           f'{json.dumps({"name": "note", "arguments": {"x": [1, "é"]}})}\n</tool_call>'
    c = constraint()
    assert c.mask() is None  # free text until a call opens
    feed(c, [*tokenizer().encode(text, add_special_tokens=False).ids, EOS])
    assert c.phase == "after"


def test_a_call_is_held_to_the_tools() -> None:
    c = constraint()
    t = tokenizer()
    feed(c, [TAGS.open, *t.encode('\n{"name": "', add_special_tokens=False).ids])
    m = c.mask()
    assert m is not None and m[t.token_to_id("set")] and not m[t.token_to_id("get")] and not m[EOS]
    feed(c, t.encode('set_light", "arguments": {"on": true, "room": "', add_special_tokens=False).ids)
    m = c.mask()
    assert m is not None and m[t.token_to_id("hall")] and m[t.token_to_id("k")] and not m[t.token_to_id("bed")]
    assert not m[TAGS.close] and not m[TAGS.open] and not m[EOS]  # the call is not complete
    feed(c, t.encode('hall"}}', add_special_tokens=False).ids)
    m = c.mask()
    assert m is not None and m[TAGS.close] and not m[EOS]  # complete: only the close tag (or whitespace)
    assert set(np.flatnonzero(m)) - {TAGS.close} <= spaces()


@pytest.mark.parametrize("one_call", [False, True])
def test_after_a_call_only_another_call_or_the_end(one_call: bool) -> None:
    c = constraint(primed=b'\n{"name": "', one_call=one_call)
    t = tokenizer()
    feed(c, [*t.encode('note", "arguments": {}}\n', add_special_tokens=False).ids, TAGS.close])
    want = spaces() | {EOS} | (set() if one_call else {TAGS.open})
    assert set(np.flatnonzero(c.mask())) == want  # type: ignore[arg-type]
    for _ in range(LEAD_SPACE):
        feed(c, t.encode(" ", add_special_tokens=False).ids)
    assert set(np.flatnonzero(c.mask())) == want - spaces()  # type: ignore[arg-type]


def test_reasoning_is_free_and_its_calls_are_not_calls() -> None:
    c = constraint("start")
    feed(c, [THINK.open, TAGS.open, *tokenizer().encode("anything {", add_special_tokens=False).ids])
    assert c.phase == "thinking" and c.mask() is None
    feed(c, [THINK.close, TAGS.open])
    assert c.phase == "call" and c.mask() is not None
    opened = constraint("open")
    feed(opened, [TAGS.open])
    assert opened.phase == "thinking"


def test_primed_starts_inside_the_call() -> None:
    c = constraint(primed=b'\n{"name": "')
    m = c.mask()
    t = tokenizer()
    assert m is not None and m[t.token_to_id("note")] and not m[t.token_to_id("get")]
    with pytest.raises(ValueError, match="does not start a call"):
        constraint(primed=b'\n{"nom": "')


def test_a_refused_token_ends_the_constraint(caplog: pytest.LogCaptureFixture) -> None:
    c = constraint()
    c.accept(TAGS.open)
    with caplog.at_level(logging.WARNING):
        c.accept(tokenizer().token_to_id("hello"))
    assert c.phase == "off" and c.mask() is None and "not allowed" in caplog.text
    c.accept(TAGS.open)
    assert c.mask() is None


def test_min_tokens_leaves_only_eos_after_a_call() -> None:
    """EOS is banned until min_tokens: another call must not become the only choice."""
    c = constraint(primed=b'\n{"name": "', min_tokens=50)
    feed(c, [*tokenizer().encode('note", "arguments": {}}', add_special_tokens=False).ids, TAGS.close])
    assert set(np.flatnonzero(c.mask())) == {EOS}  # type: ignore[arg-type]


def test_a_tag_spelled_out_in_plain_tokens_is_refused() -> None:
    """The parser reads text: `<` `tool` `_call` `>` would open a call the grammar never saw."""
    t = tokenizer()
    pieces = [t.token_to_id(p) for p in ("<", "tool", "_call", ">")]
    assert None not in pieces
    c = constraint()
    feed(c, [*t.encode("I will call it. <tool", add_special_tokens=False).ids, pieces[2]])
    m = c.mask()
    assert m is not None and not m[pieces[3]] and m[t.token_to_id("(")] and m[TAGS.open]
    assert m.sum() > 150_000  # only the tokens that would complete the tag are refused
    feed(c, [t.token_to_id("(")])
    assert c.mask() is None  # the partial tag is gone: free again


def test_a_special_token_between_tag_pieces_does_not_hide_it() -> None:
    """skip_special_tokens drops `<|box_start|>` from the text: `<tool` + it + `_call` + `>`
    still reads as the tag."""
    t = tokenizer()
    box = t.token_to_id("<|box_start|>")
    c = constraint()
    feed(c, [*t.encode(" <tool", add_special_tokens=False).ids, box, t.token_to_id("_call")])
    m = c.mask()
    assert m is not None and not m[t.token_to_id(">")] and m[TAGS.open]


def test_value_or_calls_is_chosen_by_the_first_token() -> None:
    from edgemoe.structured.constraint import OutputConstraint
    from edgemoe.structured.value_or_calls import ValueOrCalls
    token_bytes, vocab = qwen_vocab()
    t = tokenizer()

    def both() -> ValueOrCalls:
        value = OutputConstraint(TokenMasks(PaddedValue(Grammar.from_schema(LIGHT)), vocab), token_bytes,
                                 frozenset({EOS}), "start", THINK)
        return ValueOrCalls(value, constraint(), TAGS.open)

    c = both()
    first = c.mask()
    assert first is not None and first[TAGS.open] and first[t.token_to_id("{")] and first[THINK.open]
    feed(c, [THINK.open, t.token_to_id("hmm"), THINK.close, t.encode("\n\n", add_special_tokens=False).ids[0]])
    assert c.mask()[TAGS.open]  # type: ignore[index]  # still before the value
    feed(c, [t.token_to_id("{")])
    m = c.mask()
    assert m is not None and not m[TAGS.open] and not c.calling  # committed to the value
    c = both()
    feed(c, [TAGS.open])
    m = c.mask()
    assert c.calling and m is not None and m[t.token_to_id("{")] and not m[EOS]  # inside a call


def test_value_or_calls_counts_the_tokens_before_the_calls_for_min_tokens() -> None:
    """min_tokens counts the whole output: a think block before the calls counts, so past
    it another call (not only EOS) may follow the first."""
    from edgemoe.structured.constraint import OutputConstraint
    from edgemoe.structured.value_or_calls import ValueOrCalls
    token_bytes, vocab = qwen_vocab()
    t = tokenizer()
    value = OutputConstraint(TokenMasks(PaddedValue(Grammar.from_schema(LIGHT)), vocab), token_bytes,
                             frozenset({EOS}), "start", THINK)
    c = ValueOrCalls(value, constraint(min_tokens=30), TAGS.open)
    feed(c, [THINK.open, *t.encode(" x" * 25, add_special_tokens=False).ids, THINK.close, TAGS.open])
    feed(c, [*t.encode('\n{"name": "note", "arguments": {}}', add_special_tokens=False).ids, TAGS.close])
    m = c.mask()
    assert m is not None and m[TAGS.open] and m[EOS]  # 30 tokens written: a second call may follow


def test_only_masks_that_follow_the_token_wait_for_it() -> None:
    """Overlap scheduling completes the step in flight only for a constraint whose next
    mask depends on the token it samples: not inside a think block (None whatever comes,
    the close included), nor once off; in text (a tag may open) and in a call, always."""
    t = tokenizer()
    c = constraint(reasoning="open")
    assert c.phase == "thinking" and not c.waits_for_token() and c.mask() is None
    feed(c, [t.token_to_id("hmm"), THINK.close])
    assert c.phase == "text" and c.mask() is None and c.waits_for_token()  # <tool_call> would mask the next
    feed(c, [TAGS.open])
    assert c.waits_for_token()
    c.unconstrain()
    assert not c.waits_for_token()


def test_a_think_block_leaves_its_next_mask_to_the_device() -> None:
    """Inside a think block an output constraint doesn't wait for the token in flight: its
    next mask is the value's first where that token is the close, else none
    (`pending_mask`); beside tools the close may be followed by a call's tag too."""
    from edgemoe.structured.constraint import OutputConstraint
    from edgemoe.structured.value_or_calls import ValueOrCalls
    token_bytes, vocab = qwen_vocab()
    t = tokenizer()

    def value() -> OutputConstraint:
        return OutputConstraint(TokenMasks(PaddedValue(Grammar.from_schema(LIGHT)), vocab), token_bytes,
                                frozenset({EOS}), "open", THINK)

    v = value()
    assert not v.waits_for_token() and v.mask() is None
    close, after = v.pending_mask()  # type: ignore[misc]
    assert close == THINK.close and after[t.token_to_id("{")] and not after[TAGS.open] and not after[EOS]
    v.accept(THINK.close)
    assert v.waits_for_token() and v.pending_mask() is None and np.array_equal(v.mask(), after)  # type: ignore[arg-type]
    both = ValueOrCalls(value(), constraint(), TAGS.open)
    assert not both.waits_for_token() and both.pending_mask()[1][TAGS.open]  # type: ignore[index]
