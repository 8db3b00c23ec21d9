"""One request's MiniMax-M2 tool calls token by token: Qwen3's real vocabulary with
MiniMax's block tags added as single tokens (as MiniMax's tokenizer has them), free text,
then a `<minimax:tool_call>` block held to the tools from its opening token to its
closing one, whose token is allowed exactly where the block is complete; `one_call`
holds it to one invoke; a forced call starts inside the block (`primed`)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from test_constraint import EOS, THINK
from tokenizers import AddedToken, Tokenizer

from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
from edgemoe.server.templates import ChatTemplate
from edgemoe.structured.call_constraint import CallConstraint, CallRules
from edgemoe.structured.call_tokens import CallTags, CallTokens, SpaceTokens, SpelledTag, tag_texts
from edgemoe.structured.constraint import LEAD_SPACE
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.vocab import Vocabulary, grammar_token_bytes
from edgemoe.structured.xml_calls import MINIMAX_M2
from edgemoe.structured.xml_tools import xml_calls

BLOCK_OPEN, BLOCK_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
LIGHT = {"type": "object", "properties": {"on": {"type": "boolean"}, "room": {"enum": ["hall", "kitchen"]},
                                          "label": {"type": "string", "maxLength": 12}},
         "required": ["on", "room"], "additionalProperties": False}
TOOLS = [["set_light", LIGHT, True], ["note", None, True]]
TEMPLATE = ChatTemplate((Path(__file__).parents[1] / "server" / "fixtures" / "minimax_m2_chat_template.jinja")
                        .read_text(encoding="utf-8"))


@cache
def tokenizer() -> Tokenizer:
    """Qwen3's tokenizer with MiniMax's block tags added (not special: MiniMax's detokenizer
    keeps them in the text, as the parser needs)."""
    t = Tokenizer.from_file(str(qwen3_tokenizer_json()))
    t.add_tokens([AddedToken(BLOCK_OPEN, special=False), AddedToken(BLOCK_CLOSE, special=False)])
    return t


@cache
def vocab() -> tuple[list[bytes | None], Vocabulary]:
    token_bytes = grammar_token_bytes(tokenizer())
    return token_bytes, Vocabulary(token_bytes, len(token_bytes) + 7)


def tags() -> CallTags:
    return CallTags(tokenizer().token_to_id(BLOCK_OPEN), tokenizer().token_to_id(BLOCK_CLOSE))


@cache
def call_tokens() -> CallTokens:
    token_bytes, v = vocab()
    return CallTokens(tags(), SpaceTokens(token_bytes), SpelledTag(token_bytes, v.width, tag_texts("minimax_m2")[0]))


@cache
def masks(one_call: bool) -> TokenMasks:
    return TokenMasks(xml_calls(TOOLS, MINIMAX_M2, one_call), vocab()[1])


def constraint(one_call: bool = False, primed: bytes | None = None, reasoning: str = "none") -> CallConstraint:
    rules = CallRules(frozenset({EOS}), one_call)
    token_bytes = vocab()[0]
    return CallConstraint(masks(one_call), token_bytes, call_tokens(), rules, reasoning, THINK, primed)  # type: ignore[arg-type]


def ids(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False).ids


def feed(c: CallConstraint, token_ids: list[int]) -> None:
    """Accept `token_ids`, each one allowed by the mask before it (None: unconstrained)."""
    for t in token_ids:
        m = c.mask()
        assert m is None or m[t], (t, tokenizer().decode([t], skip_special_tokens=False))
        c.accept(t)


def template_turn(calls: list[tuple[str, dict]]) -> str:
    """An assistant turn's text as MiniMax-M2's template writes it (content, then the block)."""
    turn = {"role": "assistant", "content": "Sure.", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}
    tools = [{"type": "function", "function": {"name": n, "parameters": p or {"type": "object"}}} for n, p, _ in TOOLS]
    text = TEMPLATE.render([{"role": "user", "content": "hi"}, turn], tools=tools, add_generation_prompt=False)
    return text[text.rindex("Sure.") : text.rindex(BLOCK_CLOSE) + len(BLOCK_CLOSE)]


def test_the_block_tags_are_single_tokens() -> None:
    turn = template_turn([("note", {})])
    assert tags().open in ids(turn) and tags().close in ids(turn)
    assert tag_texts("minimax_m2") == (BLOCK_OPEN.encode(), BLOCK_CLOSE.encode())


def test_the_templates_block_passes_token_by_token() -> None:
    """Two invokes in one block, tokenized as the model saw them in training, then EOS."""
    text = template_turn([("set_light", {"on": True, "room": "kitchen", "label": "a \"b\"\n<c>"}), ("note", {})])
    c = constraint()
    assert c.mask() is None  # free text until the block opens
    feed(c, [*ids(text), EOS])
    assert c.phase == "after"


def test_the_close_tag_only_where_the_block_is_complete() -> None:
    c = constraint()
    feed(c, [tags().open, *ids('\n<invoke name="set_light">\n<parameter name="on">true</parameter>\n')])
    m = c.mask()
    assert m is not None and not m[tags().close] and not m[EOS] and not m[tags().open]  # room is required
    feed(c, ids('<parameter name="room">hall</parameter>\n</invoke>'))
    m = c.mask()
    assert m is not None and m[tags().close] and not m[EOS]
    assert m[ids("<")[0]] and m[ids("\n")[0]]  # another invoke may follow, or whitespace


def test_one_call_holds_the_block_to_one_invoke() -> None:
    """After the first invoke only whitespace and the block's close; after the block, no other."""
    opening = [t for t, b in enumerate(vocab()[0]) if b and b.startswith(b"<")]  # what may begin an invoke
    for one_call in (True, False):
        c = constraint(one_call)
        feed(c, [tags().open, *ids('\n<invoke name="note">\n</invoke>\n')])
        m = c.mask()
        assert m is not None and m[tags().close] and m[ids(" ")[0]]
        assert m[opening].any() != one_call
        feed(c, [tags().close])
        m = c.mask()
        assert m is not None and m[EOS] and m[tags().open] != one_call


def test_the_opening_tag_spelled_in_plain_tokens_is_refused() -> None:
    """The parser reads text: `<minimax:tool_call>` in plain pieces would open a block the
    grammar never saw. Only the piece that completes it is refused."""
    plain = Tokenizer.from_file(str(qwen3_tokenizer_json()))  # without the added tags: plain pieces
    pieces = plain.encode("I will. " + BLOCK_OPEN, add_special_tokens=False).ids
    assert len(pieces) > 4 and tags().open not in pieces
    c = constraint()
    feed(c, pieces[:-1])
    m = c.mask()
    assert m is not None and not m[pieces[-1]] and m[tags().open] and m.sum() > 150_000
    plain_hermes = plain.encode("<tool_call>", add_special_tokens=False).ids
    c = constraint()
    feed(c, plain_hermes)  # another format's tag is plain text here
    assert c.phase == "text"


@pytest.mark.parametrize("primed, allowed, refused", [
    (b'\n<invoke name="', ["set", "note"], ["get", "<"]),
    (b'\n<invoke name="set_light">\n', ["<parameter"], ["</invoke"]),  # on and room are required
])
def test_a_forced_call_starts_inside_the_block(primed: bytes, allowed: list[str], refused: list[str]) -> None:
    c = constraint(primed=primed)
    assert c.phase == "call"
    m = c.mask()
    assert m is not None and all(m[ids(w)[0]] for w in allowed) and not any(m[ids(w)[0]] for w in refused)
    with pytest.raises(ValueError, match="does not start a call"):
        constraint(primed=b"\n<function=")


def test_reasoning_is_free_until_it_closes() -> None:
    """MiniMax's prompt opens the think block: a block written while reasoning is not a call."""
    c = constraint(reasoning="open")
    feed(c, [tags().open, *ids("<invoke anything"), THINK.close, *ids("\n\n"), tags().open])
    assert c.phase == "call"
    after = c.mask()
    assert after is not None and after[ids("\n")[0]] and after[ids("<")[0]] and not after[ids("x")[0]]


def test_whitespace_between_invokes_is_bounded() -> None:
    c = constraint()
    feed(c, [tags().open, *ids('\n<invoke name="note">\n</invoke>')])
    feed(c, ids(" " * LEAD_SPACE))
    m = c.mask()
    assert m is not None and not m[ids(" ")[0]] and m[tags().close] and m[ids("<")[0]]
