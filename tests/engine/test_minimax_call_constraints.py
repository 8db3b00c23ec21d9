"""The engine's constraints for MiniMax-M2 calls (`StructuredOutput(tool_format="minimax_m2")`,
engine/constraints.py): its block tags are looked up in the tokenizer, a tokenizer without
them as single tokens is refused naming them, and `one_call` shapes the block's grammar
(one invoke) while the same tools without it allow several. Qwen3's real tokenizer with
MiniMax's tags added stands in for MiniMax's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer

from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
from edgemoe.engine.constraints import Constraints
from edgemoe.messages import StructuredOutput

EOS = 151645  # <|im_end|>
TOOLS = json.dumps([["note", {"type": "object", "properties": {"text": {"type": "string", "maxLength": 4}},
                              "required": ["text"]}, True]])
INVOKE = '\n<invoke name="note">\n<parameter name="text">hi</parameter>\n</invoke>\n'


def tokenizer(with_tags: bool) -> Tokenizer:
    t = Tokenizer.from_file(str(qwen3_tokenizer_json()))
    if with_tags:
        t.add_tokens([AddedToken("<minimax:tool_call>"), AddedToken("</minimax:tool_call>")])
    return t


def spec(one_call: bool = False, primed: str | None = None) -> StructuredOutput:
    return StructuredOutput(schema=TOOLS, target="calls", tool_format="minimax_m2", one_call=one_call, primed=primed)


def test_a_tokenizer_without_the_block_tags_is_refused_naming_them() -> None:
    constraints = Constraints(tokenizer(False), 151936, frozenset({EOS}))
    with pytest.raises(ValueError, match="<minimax:tool_call> and </minimax:tool_call>"):
        constraints.check(spec())
    constraints.check(StructuredOutput(schema=TOOLS, target="calls", tool_format="qwen3_coder"))  # Qwen's tags: there


def test_the_block_is_held_between_minimax_tags() -> None:
    t = tokenizer(True)
    open_id, close_id = t.token_to_id("<minimax:tool_call>"), t.token_to_id("</minimax:tool_call>")
    starts_an_invoke = [i for i in range(t.get_vocab_size()) if t.decode([i]).startswith("<")
                        and i not in (open_id, close_id)]
    constraints = Constraints(t, 151936, frozenset({EOS}))
    for one_call in (False, True):
        rid = f"r{one_call}"
        constraints.check(spec(one_call))
        constraints.attach(rid, spec(one_call), [])
        c = constraints.by_request[rid]
        for token in [open_id, *t.encode(INVOKE, add_special_tokens=False).ids]:
            allowed = c.mask()
            assert allowed is None or allowed[token]
            constraints.accept(rid, token)
        allowed = c.mask()
        assert allowed is not None and allowed[close_id] and not allowed[t.token_to_id("<tool_call>")]
        assert np.any(allowed[starts_an_invoke]) != one_call
        constraints.release(rid)


def test_a_forced_call_is_primed_past_the_block_tag() -> None:
    t = tokenizer(True)
    constraints = Constraints(t, 151936, frozenset({EOS}))
    constraints.attach("r", spec(primed='\n<invoke name="'), [])
    allowed = constraints.by_request["r"].mask()
    assert allowed is not None and allowed[t.token_to_id("note")] and not allowed[t.token_to_id("set")]
    with pytest.raises(ValueError, match="does not start a call"):
        constraints.check(spec(primed="\n<function="))
