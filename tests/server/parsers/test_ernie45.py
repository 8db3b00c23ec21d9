"""ERNIE-4.5 Thinking's `<response>` answer tags (parsers/ernie45.py): the filter alone, behind
the <think> split and beside the hermes tool parser, over every chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsers_harness import MakeParser, assert_chunking_invariant, chunks_at, counter_ids, stream, summary

from edgemoe.server.parsers import AnswerTagResponseParser, ThinkReasoningParser, get_tool_parser, strips_answer_tags
from edgemoe.server.parsers.ernie45 import AnswerTagFilter

CALL = '<tool_call>\n{"name": "ls", "arguments": {"dir": "."}}\n</tool_call>'
LS = [("ls", {"dir": "."})]


def ernie(tools: bool = False, starts_in_reasoning: bool | None = True) -> MakeParser:
    """ERNIE's pipeline; `starts_in_reasoning` None: thinking off (no reasoning parser)."""

    def make() -> AnswerTagResponseParser:
        tp = get_tool_parser("hermes")(None, counter_ids()) if tools else None
        rp = ThinkReasoningParser(starts_in_reasoning) if starts_in_reasoning is not None else None
        return AnswerTagResponseParser(rp, tp)

    return make


# (id, hermes beside it, starts_in_reasoning, model output, (content, reasoning, calls))
CASES = [
    ("tagged answer", False, True, "plan\n</think>\n\n<response>\nThe answer is 4.\n</response>\n",
     ("The answer is 4.", "plan", [])),
    ("untagged answer", False, True, "plan\n</think>\nThe answer is 4.", ("The answer is 4.", "plan", [])),
    ("inner newlines kept", False, True, "p</think>\n\n<response>\n\na\n\nb\n\n</response>\n\n",
     ("a\n\nb", "p", [])),
    ("cut off inside the answer", False, True, "p\n</think>\n\n<response>\nso far\n",
     ("so far\n", "p", [])),
    ("cut off inside the closing tag", False, True, "p</think>\n\n<response>\nso far\n</resp",
     ("so far\n</resp", "p", [])),
    ("cut off inside the opening tag", False, True, "p</think>\n\n<resp", ("<resp", "p", [])),
    ("cut off right after the opening tag", False, True, "p</think>\n\n<response>\n", ("", "p", [])),
    ("literal close tag mid-answer", False, True,
     "p</think>\n\n<response>\nWrite </response> to end.\n</response>\n",
     ("Write </response> to end.", "p", [])),
    ("close tag then more text", False, True, "p</think><response>\na\n</response>\n\nb",
     ("a\n</response>\n\nb", "p", [])),
    ("two close tags at the end", False, True, "p</think><response>a</response>\n</response>",
     ("a</response>", "p", [])),
    ("no opening tag: close tag stays", False, True, "p</think>\n\nhi\n</response>\n",
     ("hi\n</response>\n", "p", [])),
    ("opening tag not at the start stays", False, True, "p</think>\nsay <response>\nx\n</response>",
     ("say <response>\nx\n</response>", "p", [])),
    ("tags inside reasoning are reasoning", False, True, "<response>x</response>\n</think>\n\nok",
     ("ok", "<response>x</response>", [])),
    ("thinking off: tags still unwrapped", False, None, "<response>\nhello\n</response>\n", ("hello", "", [])),
    ("thinking off, newlines before the tag", False, None, "\n\n<response>\nhi</response>", ("hi", "", [])),
    ("thinking off, plain text keeps its newlines", False, None, "\n\nhi", ("\n\nhi", "", [])),
    ("call after </think>", True, True, "plan\n</think>\n\n" + CALL + "\n", ("", "plan", LS)),
    ("tagged answer beside a call", True, True,
     "plan\n</think>\n\n<response>\nChecking.\n</response>\n" + CALL, ("Checking.", "plan", LS)),
    ("call inside the answer", True, True,
     "plan</think>\n\n<response>\nOK.\n" + CALL + "\n</response>\n", ("OK.", "plan", LS)),
]


@pytest.mark.parametrize(("tools", "starts", "text", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_expected_and_chunking_invariant(tools: bool, starts: bool | None, text: str, expected: tuple) -> None:
    whole = assert_chunking_invariant(ernie(tools, starts), text)
    assert summary(whole) == expected


@pytest.mark.parametrize(("tools", "starts", "text"), [c[1:4] for c in CASES], ids=[c[0] for c in CASES])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_chunkings(tools: bool, starts: bool | None, text: str, data: st.DataObject) -> None:
    make = ernie(tools, starts)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert stream(make, chunks_at(text, cuts)) == make().parse_complete(text)


def test_possible_end_is_held_then_released() -> None:
    """A `</response>` is held while it may end the output, released when text follows."""
    f = AnswerTagFilter()
    assert f.feed("<response>\nA\n") == "A"  # the newline may precede the closing tag
    assert f.feed("</response>\n") == ""
    assert f.feed("B") == "\n</response>\nB"
    assert f.feed("\n</resp") == ""
    assert f.finish() == "\n</resp"


def test_filter_drops_only_a_final_close() -> None:
    f = AnswerTagFilter()
    assert f.feed("<response>\nA\n</response>") == "A"
    assert f.feed(" \n") == ""
    assert f.finish() == ""
    with pytest.raises(RuntimeError):
        f.feed("x")


def test_untagged_content_passes_at_once() -> None:
    f = AnswerTagFilter()
    assert f.feed("\n") == ""  # may still be the newline before <response>
    assert f.feed("Hi </response>") == "\nHi </response>"
    assert f.finish() == ""


def test_selection() -> None:
    assert strips_answer_tags("ernie4_5_moe", "")
    assert strips_answer_tags("qwen3_moe", "{{ '<response>\\n' + content }}")
    assert not strips_answer_tags("qwen3_moe", "{{ '<think>' }}")
