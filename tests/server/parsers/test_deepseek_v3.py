"""DeepSeek-V3 / V3.1 / R1 tool calls: both spellings, malformed text, chunking."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from parsers_harness import assert_chunking_invariant, fuzz_written_and_damaged, maker, stream, summary

from edgemoe.server.parsers import parser_for_chat_template, parser_for_model_type
from edgemoe.server.parsers.deepseek_v3 import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
    call_opening,
    fenced_template,
    writable_name,
)

MAKE = maker("deepseek_v3")


def call31(name: str, args: str) -> str:
    """One call as DeepSeek-V3.1's template writes it (`args`: the JSON text)."""
    return f"{CALL_BEGIN}{name}{SEP}{args}{CALL_END}"


def call3(name: str, args: str) -> str:
    """The same as DeepSeek-V3-0324 / R1-0528's template writes it: type first, fenced."""
    return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}"


def section(*calls: str, sep: str = "") -> str:
    return CALLS_BEGIN + sep.join(calls) + CALLS_END


WEATHER = '{"city": "Paris", "days": 3}'
NESTED = {"path": "ü/日本.txt", "opts": {"a": [1, 2.5, {"b": None}], "t": True}, "s": 'q " \\ é',
          "markers": f"{CALL_END}{CALLS_END}```"}
NESTED_JSON = json.dumps(NESTED, ensure_ascii=False)

CASES = [
    ("plain", "Just text.\n", ("Just text.\n", "", [])),
    ("3.1 text + call", "Sure.\n\n" + section(call31("get_weather", WEATHER)),
     ("Sure.", "", [("get_weather", {"city": "Paris", "days": 3})])),
    ("3 / R1 text + call", "Sure." + section(call3("get_weather", WEATHER)),
     ("Sure.", "", [("get_weather", {"city": "Paris", "days": 3})])),
    ("3.1 two calls", section(call31("a", '{"x": 1}'), call31("b", "{}")), ("", "", [("a", {"x": 1}), ("b", {})])),
    ("R1 two calls, newline between", section(call3("a", '{"x": 1}'), call3("b", "{}"), sep="\n"),
     ("", "", [("a", {"x": 1}), ("b", {})])),
    ("both spellings in one section", section(call3("a", "{}"), call31("b", '{"y": [1]}'), sep="\n"),
     ("", "", [("a", {}), ("b", {"y": [1]})])),
    ("nested unicode and markers in strings", section(call31("write", NESTED_JSON)), ("", "", [("write", NESTED)])),
    ("name not among the tools", section(call31("mcp__fs.read", '{"n": 42}')), ("", "", [("mcp__fs.read", {"n": 42})])),
    ("a tool named function", section(call31("function", '{"n": 1}')), ("", "", [("function", {"n": 1})])),
    ("fence without language", section(f"{CALL_BEGIN}function{SEP}f\n```\n{{}}\n```{CALL_END}"), ("", "", [("f", {})])),
    ("3.1 name with a fence", section(f"{CALL_BEGIN}f{SEP}```json\n{{\"a\": 1}}\n```{CALL_END}"),
     ("", "", [("f", {"a": 1})])),
    ("whitespace between parts", f"{CALLS_BEGIN}\n {CALL_BEGIN} f \n{SEP}\n{{ \"a\" : 1 }}\n{CALL_END}\n\n{CALLS_END}",
     ("", "", [("f", {"a": 1})])),
    ("text after the section", section(call31("f", "{}")) + "\n\nDone.", ("Done.", "", [("f", {})])),
    ("a second section", "A " + section(call31("f", "{}")) + " B " + section(call3("g", "{}")),
     ("AB", "", [("f", {}), ("g", {})])),
    ("values re-serialised", section(call31("f", '{"a":1.50,"b":[ true ,null]}')),
     ("", "", [("f", {"a": 1.5, "b": [True, None]})])),
    ("missing call end is forgiven", section(f"{CALL_BEGIN}f{SEP}{{}}", call31("g", "{}")),
     ("", "", [("f", {}), ("g", {})])),
    ("fence left open is forgiven", section(f"{CALL_BEGIN}function{SEP}f\n```json\n{{}}{CALL_END}"),
     ("", "", [("f", {})])),
    # the stop: what it cut off after a call was announced, never the call
    ("stop after the call's end", CALLS_BEGIN + call31("f", '{"a": 1}'), ("", "", [("f", {"a": 1})])),
    ("stop after the object", CALLS_BEGIN + f"{CALL_BEGIN}f{SEP}{{}}", ("", "", [("f", {})])),
    ("stop in the closing fence", CALLS_BEGIN + f"{CALL_BEGIN}function{SEP}f\n```json\n{{}}\n``",
     ("", "", [("f", {})])),
    ("stop inside the arguments", "Checking.\n" + CALLS_BEGIN + f'{CALL_BEGIN}read{SEP}{{"path": "a.py", "mode": "r',
     ('Checking., "mode": "r', "", [("read", {"path": "a.py"})])),
    ("stop before the object", f"Ok {CALLS_BEGIN}{CALL_BEGIN}get_wea",
     (f"Ok {CALLS_BEGIN}{CALL_BEGIN}get_wea", "", [])),
    ("stop after the section's marker", f"Ok{CALLS_BEGIN}", (f"Ok{CALLS_BEGIN}", "", [])),
    ("stop before the second call's object", CALLS_BEGIN + call31("f", "{}") + f"{CALL_BEGIN}g{SEP}",
     (f"{CALL_BEGIN}g{SEP}", "", [("f", {})])),
    # malformed: no call before the first announcement, the rest as text after it
    ("invalid JSON after the name", section(call31("x", '{"a": 1, "b": tru e}')),
     (f', "b": tru e}}{CALL_END}{CALLS_END}', "", [("x", {"a": 1})])),
    ("arguments not an object", section(call31("f", "[1]")), (section(call31("f", "[1]")), "", [])),
    ("string arguments", section(call31("f", '"{}"')), (section(call31("f", '"{}"')), "", [])),
    ("name with a blank", section(call31("get weather", "{}")), (section(call31("get weather", "{}")), "", [])),
    ("empty name", section(call31("", "{}")), (section(call31("", "{}")), "", [])),
    ("no separator", section(f"{CALL_BEGIN}f {{}}{CALL_END}"), (section(f"{CALL_BEGIN}f {{}}{CALL_END}"), "", [])),
    ("prose in the section", f"{CALLS_BEGIN}I will call it{CALLS_END}",
     (f"{CALLS_BEGIN}I will call it{CALLS_END}", "", [])),
    ("empty section", "a " + section() + " b", ("a " + section() + " b", "", [])),
    ("a call marker outside a section is text", call31("f", "{}"), (call31("f", "{}"), "", [])),
    ("later call that is none", section(call31("f", "{}"), call31("g h", "{}")),
     (f"{call31('g h', '{}')}{CALLS_END}", "", [("f", {})])),
    ("garbage where a call should be", section(call31("f", "{}"), "oops", call31("g", "{}")),
     (f"oops{call31('g', '{}')}{CALLS_END}", "", [("f", {})])),
    ("hermes tags are text", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
     ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "", [])),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_expected_and_chunking_invariant(text: str, expected: tuple) -> None:
    """Every split point (pairs of them for short texts) and char-by-char feeding give the
    whole-text parse, and the streamed deltas keep the clients' shape (harness)."""
    whole = assert_chunking_invariant(MAKE, text, pairs_up_to=60)
    assert summary(whole) == expected


@pytest.mark.parametrize("starts_in_reasoning", [True, False])
def test_reasoning_then_calls(starts_in_reasoning: bool) -> None:
    """V3.1's thinking prompt and R1's open `<think>` themselves; a model may open it too.
    A call inside reasoning is reasoning; the one after `</think>` is a call."""
    inner = section(call31("f", '{"days": 9}'))
    after = "Checking." + section(call3("f", '{"days": 1}'), call3("g", "{}"), sep="\n")
    text = f"plan {inner}</think>\n\n{after}" if starts_in_reasoning else f"<think>\nplan {inner}\n</think>{after}"
    got = assert_chunking_invariant(maker("deepseek_v3", reasoning=starts_in_reasoning), text, pairs_up_to=0)
    assert summary(got) == ("Checking.", f"plan {inner}", [("f", {"days": 1}), ("g", {})])


def test_arguments_equal_json_dumps_of_the_object() -> None:
    message = MAKE().parse_complete(section(call3("write", json.dumps(NESTED))))
    assert message.tool_calls[0].arguments == NESTED_JSON


def test_members_stream_one_by_one() -> None:
    parser = MAKE()
    assert parser.feed("Ok." + CALLS_BEGIN + CALL_BEGIN + "write" + SEP).content == "Ok."  # no "{" yet
    head = parser.feed('{"path": "a", "body": "xx')
    assert [(d.index, d.id, d.name, d.arguments) for d in head.tool_calls] == [(0, "call_0", "write", '{"path": "a"')]
    rest = parser.feed('x"}' + CALL_END + CALL_BEGIN + "function" + SEP + "ls\n```json\n{")
    assert [(d.index, d.name, d.arguments) for d in rest.tool_calls] == [(0, None, ', "body": "xxx"}'), (1, "ls", "")]
    tail = parser.feed("}\n```" + CALL_END + CALLS_END)
    assert [d.arguments for d in tail.tool_calls] == ["{}"]
    assert parser.finish().empty
    assert parser.tool_calls_emitted == 2


def test_long_argument_streams_in_linear_time() -> None:
    body = "line of code\\n" * 4000
    text = section(call31("w", '{"body": "' + body + '"}'))
    got = stream(MAKE, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert json.loads(got.tool_calls[0].arguments)["body"] == "line of code\n" * 4000


def test_long_garbage_after_the_marker_is_content_early() -> None:
    """A run past any name's length is decided as text before the output ends."""
    parser = MAKE()
    out = parser.feed(CALLS_BEGIN + CALL_BEGIN + "a" * 300)
    assert out.content.startswith(CALLS_BEGIN) and parser.tool_calls_emitted == 0


def test_lone_surrogate_stays_escaped() -> None:
    args = MAKE().parse_complete(section(call31("f", '{"a": "x\\ud83d", "b": "é"}'))).tool_calls[0].arguments
    args.encode("utf-8")
    assert json.loads(args) == {"a": "x\ud83d", "b": "é"}


def test_format_selection() -> None:
    assert parser_for_model_type("deepseek_v3") == "deepseek_v3"
    v31 = "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>'}}"
    r1 = v31.replace("' + tool['function']['name']", "function<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json")
    assert parser_for_chat_template(v31) == parser_for_chat_template(r1) == "deepseek_v3"
    assert not fenced_template(v31) and fenced_template(r1)
    # the other formats' templates still pick theirs
    assert parser_for_chat_template('<tool_call>\n{"name": <function-name>}\n</tool_call>') == "hermes"
    assert parser_for_chat_template("<tool_call>{function-name}<arg_key>k</arg_key><arg_value>") == "glm45"
    assert parser_for_chat_template("<|start|>assistant<|channel|>final<|message|>") == "harmony"


def test_openings_and_names() -> None:
    assert call_opening("f", fenced=False) == f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}"
    assert call_opening("f", fenced=True) == f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n"
    assert call_opening(None, fenced=False) == call_opening(None, fenced=True) == CALLS_BEGIN + CALL_BEGIN
    assert all(writable_name(n) for n in ("get_weather", "mcp__fs.read", "a-b:c/d", "function"))
    assert not any(writable_name(n) for n in ("", "a b", "a<b", 'a"b', "a`b", "a{b", "x" * 257, "a\n"))
    for name in ("get_weather", "mcp__fs.read"):  # what an opening names reads back as that name
        for fenced in (False, True):
            close = "\n```" if fenced else ""
            got = MAKE().parse_complete(call_opening(name, fenced) + '{"a": 1}' + close + CALL_END + CALLS_END)
            assert summary(got) == ("", "", [(name, {"a": 1})])
            # "required": the opening stops before the name, which the model writes
            rest = (f"function{SEP}{name}\n```json\n{{}}\n```" if fenced else f"{name}{SEP}{{}}") + CALL_END
            assert summary(MAKE().parse_complete(call_opening(None, fenced) + rest)) == ("", "", [(name, {})])


# Fixed-seed fuzz: sections written as the templates write them (random spelling, JSON values
# holding the format's own markers), prose around them, then random damage. Undamaged: the
# calls read back exactly; always: streamed == one shot.
VALUES: list[Any] = [0, -3, 1e-7, True, None, "Paris", "", " a\nb ", CALL_END, CALLS_BEGIN, "```", "é😀",
                     {"k": [1, None, SEP]}, [], ["x", "{"]]
DAMAGE = [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP, "```", "{", "}", '"', "\n", " ", "x", "<"]


def written_section(rnd: random.Random) -> tuple[str, list[dict[str, Any]]]:
    calls = [{f"k{i}": rnd.choice(VALUES) for i in range(rnd.randint(0, 3))} for _ in range(rnd.randint(1, 3))]
    spell = rnd.choice([call31, call3])
    text = section(*(spell("f", json.dumps(a, ensure_ascii=rnd.random() < 0.5)) for a in calls),
                   sep="\n" if spell is call3 else "")
    return text, calls


def test_fuzz_written_and_damaged_calls() -> None:
    fuzz_written_and_damaged(MAKE, written_section, DAMAGE, seed=3107)
