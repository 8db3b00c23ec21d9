"""<think> splitting alone and in front of the tool parsers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsers_harness import assert_chunking_invariant, chunks_at, maker, stream, summary

from edgemoe.server.parsers import ThinkReasoningParser, prompt_opens_reasoning

HERMES_CALL = '<tool_call>\n{"name": "ls", "arguments": {"dir": "."}}\n</tool_call>'
CODER_CALL = (
    "<tool_call>\n<function=ls>\n<parameter=dir>\n.\n</parameter>\n</function>\n</tool_call>"
)

# (id, tool parser, starts_in_reasoning (None: no reasoning parser), text, expected)
CASES = [
    ("opened by the prompt", None, True, "Let me think.\nStep 2.\n</think>\n\nThe answer is 4.",
     ("The answer is 4.", "Let me think.\nStep 2.", [])),
    ("opened by the model", None, False, "<think>\nhmm\n</think>\n\nHi",
     ("Hi", "hmm", [])),
    ("model repeats the open tag", None, True, "<think>\nhmm\n</think>\n\nHi",
     ("Hi", "hmm", [])),
    ("whitespace before the open tag", None, False, "\n <think>a</think>b", ("b", "a", [])),
    ("no tag, not in reasoning", None, False, "Plain <think>x</think> text",
     ("Plain <think>x</think> text", "", [])),
    ("thinking disabled: no reasoning parser", None, None, "<think>\nx\n</think>\n\ny",
     ("<think>\nx\n</think>\n\ny", "", [])),
    ("reasoning cut off by the stop", None, True, "thinking... \n</thi",
     ("", "thinking... \n</thi", [])),
    ("reasoning cut off, newline only", None, True, "thinking\n\n", ("", "thinking", [])),
    ("empty reasoning", None, True, "</think>\n\nok", ("ok", "", [])),
    ("second </think> is content", None, True, "a</think>b</think>c", ("b</think>c", "a", [])),
    ("inner newlines kept", None, True, "\n\na\n\nb\n\n</think>\n\n\nc\n",
     ("c\n", "a\n\nb", [])),
    ("reasoning then hermes call", "hermes", True, "plan\n</think>\n\n" + HERMES_CALL,
     ("", "plan", [("ls", {"dir": "."})])),
    ("reasoning then coder call", "qwen3_coder", True, "plan\n</think>\n\nSure.\n" + CODER_CALL,
     ("Sure.", "plan", [("ls", {"dir": "."})])),
    ("calls inside reasoning are reasoning", "hermes", True,
     "maybe " + HERMES_CALL + "\n</think>\n\nno call",
     ("no call", "maybe " + HERMES_CALL, [])),
    ("thinking disabled with a call", "qwen3_coder", None, CODER_CALL,
     ("", "", [("ls", {"dir": "."})])),
]


@pytest.mark.parametrize(("tool", "starts", "text", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_expected_and_chunking_invariant(tool: str | None, starts: bool | None, text: str,
                                         expected: tuple) -> None:
    whole = assert_chunking_invariant(maker(tool, None, starts), text)
    assert summary(whole) == expected


@pytest.mark.parametrize(("tool", "starts", "text"), [c[1:4] for c in CASES],
                         ids=[c[0] for c in CASES])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_chunkings(tool: str | None, starts: bool | None, text: str,
                          data: st.DataObject) -> None:
    make = maker(tool, None, starts)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert stream(make, chunks_at(text, cuts)) == make().parse_complete(text)


def test_partial_close_tag_is_held_then_released() -> None:
    parser = ThinkReasoningParser(starts_in_reasoning=True)
    assert parser.feed("abc</thi") == ("abc", "")
    assert parser.feed("nk>\n\nanswer") == ("", "answer")
    assert parser.finish() == ("", "")


def test_partial_tag_that_is_not_one_is_reasoning() -> None:
    parser = ThinkReasoningParser(starts_in_reasoning=True)
    assert parser.feed("a </th") == ("a ", "")
    assert parser.feed("ese") == ("</these", "")


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def test_finish_twice_raises() -> None:
    parser = ThinkReasoningParser()
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.finish()
