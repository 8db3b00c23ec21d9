"""GLM-4.5/4.6/4.7 tool calls: both spellings, typed values, malformed text, chunking."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from parsers_harness import TYPED_ARGS, TYPED_PAIRS, TYPED_PROPERTIES, fuzz_written_and_damaged
from parsers_harness import assert_chunking_invariant, maker, stream, summary

from edgemoe.server.parsers import parser_for_chat_template, parser_for_model_type
from edgemoe.server.parsers.glm45 import call_opening, compact_template, writable_name

F_PARAMETERS = {"type": "object", "properties": TYPED_PROPERTIES}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": F_PARAMETERS}},
         {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}]
MAKE = maker("glm45", TOOLS)


def call45(name: str, pairs: list[tuple[str, str]]) -> str:
    """A call as GLM-4.5/4.6's template writes it (values already as the template writes them)."""
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
    return f"<tool_call>{name}\n{body}</tool_call>"


def call47(name: str, pairs: list[tuple[str, str]]) -> str:
    """The same call as GLM-4.7's template writes it: no newlines."""
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{body}</tool_call>"


CODE = 'if a < b:\n    s = "</arg_value>"  # </tool_call>\n'

CASES = [
    ("plain", "Just text.\n", ("Just text.\n", "", [])),
    ("4.5 typed", "Sure.\n" + call45("f", TYPED_PAIRS), ("Sure.", "", [("f", TYPED_ARGS)])),
    ("4.7 typed", "Sure." + call47("f", TYPED_PAIRS), ("Sure.", "", [("f", TYPED_ARGS)])),
    ("string keeps its text", call45("f", [("city", "  007\n"), ("text", "null"), ("note", "true")]),
     ("", "", [("f", {"city": "  007\n", "text": "null", "note": "true"})])),
    ("type mismatch falls back", call45("f", [("days", "three"), ("dry_run", "maybe"), ("opts", "[1]"),
                                              ("scale", "1e400"), ("tags", "('a', 'b')")]),
     ("", "", [("f", {"days": "three", "dry_run": "maybe", "opts": [1], "scale": "1e400", "tags": ["a", "b"]})])),
    ("two calls, both spellings", call45("f", [("days", "1")]) + "\n" + call47("list_files", [])
     + "\n" + call47("f", [("city", "Oslo")]),
     ("", "", [("f", {"days": 1}), ("list_files", {}), ("f", {"city": "Oslo"})])),
    ("text between calls", "A\n" + call47("list_files", []) + "\nB\n" + call45("list_files", []) + "\n\nC",
     ("ABC", "", [("list_files", {}), ("list_files", {})])),
    ("whitespace between tags", "<tool_call> f \n<arg_key> city </arg_key>\n\n<arg_value>Rome</arg_value>  "
     "<arg_key>days</arg_key> <arg_value> 4 </arg_value>\n </tool_call>",
     ("", "", [("f", {"city": "Rome", "days": 4})])),
    ("name not among the tools", call45("mcp__fs.read", [("n", "42"), ("s", "hi there"), ("o", '{"k": [1]}')]),
     ("", "", [("mcp__fs.read", {"n": 42, "s": "hi there", "o": {"k": [1]}})])),
    ("literal closing tags in a value", call45("f", [("text", CODE), ("city", "x")]),
     ("", "", [("f", {"text": CODE, "city": "x"})])),
    ("closing tag then text in a value", call47("f", [("text", "a</arg_value>b</arg_value>\nc")]),
     ("", "", [("f", {"text": "a</arg_value>b</arg_value>\nc"})])),
    ("unfinished value at stop", "Ok.\n<tool_call>f\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n"
     "<arg_key>text</arg_key>\n<arg_value>print(",
     ("Ok.<arg_key>text</arg_key>\n<arg_value>print(", "", [("f", {"city": "Rome"})])),
    ("unfinished key at stop", "<tool_call>f<arg_key>days</arg_key><arg_value>2</arg_value><arg_key>ci",
     ("<arg_key>ci", "", [("f", {"days": 2})])),
    ("stop after the last value", "<tool_call>f\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n",
     ("", "", [("f", {"days": 2})])),
    ("stop cuts </tool_call>", "<tool_call>f<arg_key>days</arg_key><arg_value>2</arg_value></tool_",
     ("", "", [("f", {"days": 2})])),
    ("stop before the name is certain", "Ok <tool_call>get_wea", ("Ok <tool_call>get_wea", "", [])),
    ("prose mentions the tag", "Use <tool_call> tags, or <tool_call>NAME then args.",
     ("Use <tool_call> tags, or <tool_call>NAME then args.", "", [])),
    ("hermes JSON is no call", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
     ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "", [])),
    ("compact JSON is no call", '<tool_call>{"name":"f"}</tool_call>', ('<tool_call>{"name":"f"}</tool_call>', "", [])),
    ("a name line without args is no call", "<tool_call>f\nthen prose", ("<tool_call>f\nthen prose", "", [])),
    ("text after the call", call45("f", [("city", "Oslo")]) + "\n\nDone.", ("Done.", "", [("f", {"city": "Oslo"})])),
    # "oops" means that </arg_value> did not close the value, and nothing later does:
    # the call keeps no arguments and the raw text is content (as qwen3_coder's).
    ("garbage after a value", "<tool_call>f\n<arg_key>days</arg_key>\n<arg_value>1</arg_value>\noops</tool_call>",
     ("<arg_key>days</arg_key>\n<arg_value>1</arg_value>\noops</tool_call>", "", [("f", {})])),
    ("garbage instead of a pair", "<tool_call>f<arg_key>days</arg_key><arg_value>1</arg_value>"
     "<arg_key>city</arg_key>x<arg_value>2</arg_value></tool_call>",
     ("<arg_key>city</arg_key>x<arg_value>2</arg_value></tool_call>", "", [("f", {"days": 1})])),
    ("empty key", "<tool_call>f<arg_key> </arg_key><arg_value>1</arg_value></tool_call>",
     ("<arg_key> </arg_key><arg_value>1</arg_value></tool_call>", "", [("f", {})])),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_expected_and_chunking_invariant(text: str, expected: tuple) -> None:
    """Every split point (pairs of them for short texts) and char-by-char feeding give the
    whole-text parse, and the streamed deltas keep the clients' shape (harness)."""
    whole = assert_chunking_invariant(MAKE, text, pairs_up_to=60)
    assert summary(whole) == expected


def test_reasoning_then_call_both_templates() -> None:
    """GLM-4.5's model opens `<think>` itself (prompt ends `<|assistant|>`); GLM-4.7's
    prompt opens it. A call inside reasoning is reasoning."""
    inner = call47("f", [("days", "9")])
    after = "\n" + call45("f", [("days", "1")])
    for starts_in_reasoning, text in ((False, f"\n<think>plan {inner}</think>{after}"),
                                      (True, f"plan {inner}</think>{after}")):
        got = assert_chunking_invariant(maker("glm45", TOOLS, reasoning=starts_in_reasoning), text, pairs_up_to=0)
        assert summary(got) == ("", f"plan {inner}", [("f", {"days": 1})])


def test_types_are_exact() -> None:
    """1 == 1.0 == True in Python: check the JSON text, not just equality."""
    args = MAKE().parse_complete(call47("f", [("scale", "2.0"), ("line", "7"), ("dry_run", "TRUE")]))
    assert args.tool_calls[0].arguments == '{"scale": 2, "line": 7, "dry_run": true}'


def test_pairs_stream_one_by_one() -> None:
    parser = MAKE()
    assert parser.feed("<tool_call>f\n").empty  # the name is certain only once a tag follows
    head = parser.feed("<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>")
    assert [(d.id, d.name, d.arguments) for d in head.tool_calls] == [("call_0", "f", "")]
    nxt = parser.feed("\n<arg_key>")
    assert [d.arguments for d in nxt.tool_calls] == ['{"city": "Rome"']
    tail = parser.feed("days</arg_key>\n<arg_value>5</arg_value>\n</tool_call>")
    assert [d.arguments for d in tail.tool_calls] == [', "days": 5}']
    assert parser.finish().empty
    assert parser.tool_calls_emitted == 1


def test_long_value_streams_in_linear_time() -> None:
    body = "x = '</arg_value>'\n" * 3000
    text = call45("f", [("text", body)])
    got = stream(MAKE, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert json.loads(got.tool_calls[0].arguments)["text"] == body


def test_long_garbage_after_the_tag_is_content_early() -> None:
    """A run past any name's length is decided as text before the output ends."""
    parser = MAKE()
    out = parser.feed("<tool_call>" + "a" * 300)
    assert out.content.startswith("<tool_call>") and parser.tool_calls_emitted == 0


def test_format_selection() -> None:
    assert parser_for_model_type("glm4_moe") == parser_for_model_type("glm4_moe_lite") == "glm45"
    glm47 = "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    assert parser_for_chat_template(glm47) == "glm45"
    assert parser_for_chat_template('<tool_call>\n{"name": <function-name>}\n</tool_call>') == "hermes"


def test_openings_and_names() -> None:
    glm47 = "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    assert compact_template(glm47) and not compact_template(glm47.replace("}<arg_key>", "}\n<arg_key>"))
    assert call_opening("f", compact=False) == "\n<tool_call>f\n"
    assert call_opening(None, compact=False) == "\n<tool_call>"
    assert call_opening("f", compact=True) == "<tool_call>f"
    assert call_opening(None, compact=True) == "<tool_call>"
    assert all(writable_name(n) for n in ("get_weather", "mcp__fs.read", "a-b:c/d"))
    assert not any(writable_name(n) for n in ("", "a b", "a<b", 'a"b', "x" * 257, "a\n"))
    for name in ("get_weather", "mcp__fs.read"):  # what an opening names reads back as that name
        for compact in (False, True):
            got = MAKE().parse_complete(call_opening(name, compact) + "</tool_call>")
            assert [c.name for c in got.tool_calls] == [name]


# Fixed-seed fuzz: calls written as the templates write them (random spelling, values of
# each parameter's type, strings holding the format's own tags), prose around them, then
# random damage. Undamaged: the calls read back exactly; always: streamed == one shot.
SAMPLES: dict[str, list[Any]] = {
    "city": ["Paris", "", " a\nb ", "</arg_value>x", "<tool_call>", "null", "{\"k\": 1}", "é😀"],
    "days": [0, -3, 10**20], "scale": [0.5, -2.25, 1e-7], "dry_run": [True, False],
    "opts": [{}, {"a": [1, None, "</tool_call>"]}], "tags": [[], ["x", "<arg_key>"]], "line": [None, 4],
}
DAMAGE = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_value>", "<arg_value>", "\n", " ", "x", "<"]


def written_call(rnd: random.Random) -> tuple[str, list[dict[str, Any]]]:
    args = {k: rnd.choice(SAMPLES[k]) for k in rnd.sample(sorted(SAMPLES), rnd.randint(0, 3))}
    pairs = [(k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) for k, v in args.items()]
    return rnd.choice([call45, call47])("f", pairs), [args]


def test_fuzz_written_and_damaged_calls() -> None:
    fuzz_written_and_damaged(MAKE, written_call, DAMAGE, seed=4507)
