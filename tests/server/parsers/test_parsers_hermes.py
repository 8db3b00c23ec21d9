"""Hermes JSON tool calls: expected results, and chunking never changes them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsers_harness import assert_chunking_invariant, chunks_at, maker, stream, summary

from edgemoe.server.parsers.hermes import MAX_NAME, plausible_name

MAKE = maker("hermes")


def call(name: str, args: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


NESTED = {
    "path": "ü/日本.txt",
    "opts": {"a": [1, 2.5, {"b": None}], "t": True},
    "s": 'q " \\ é',
}

# (id, model output, expected (content, reasoning, [(name, arguments)]))
CASES = [
    ("plain", "Hello, world!\nNo tools here.\n", ("Hello, world!\nNo tools here.\n", "", [])),
    (
        "text+call",
        "Let me check.\n\n" + call("get_weather", {"city": "Paris"}),
        ("Let me check.", "", [("get_weather", {"city": "Paris"})]),
    ),
    (
        "two calls",
        call("a", {"x": 1}) + "\n" + call("b", {}),
        ("", "", [("a", {"x": 1}), ("b", {})]),
    ),
    ("nested unicode", call("write", NESTED), ("", "", [("write", NESTED)])),
    (
        "tags inside strings",
        call("say", {"text": "use <tool_call> and </tool_call> here", "n": "}{"}),
        ("", "", [("say", {"text": "use <tool_call> and </tool_call> here", "n": "}{"})]),
    ),
    (
        "prose mentions the tag",
        "Wrap calls in <tool_call> tags, like <tool_call>this</tool_call>.",
        ("Wrap calls in <tool_call> tags, like <tool_call>this</tool_call>.", "", []),
    ),
    (
        "unfinished before the name",
        'Checking.\n<tool_call>\n{"name": "re',
        ('Checking.\n<tool_call>\n{"name": "re', "", []),
    ),
    (
        "unfinished inside the arguments",
        'Checking.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.py", "mode": "r',
        ('Checking., "mode": "r', "", [("read", {"path": "a.py"})]),
    ),
    (
        "stop cuts the close tag",
        '<tool_call>\n{"name": "ls", "arguments": {"d": 1.5e3}}\n</tool_',
        ("", "", [("ls", {"d": 1500.0})]),
    ),
    (
        "invalid JSON, unusual key order",
        '<tool_call>\n{"arguments": {"a": 1,}, "name": "x"}\n</tool_call> after',
        ('<tool_call>\n{"arguments": {"a": 1,}, "name": "x"}\n</tool_call> after', "", []),
    ),
    (
        "invalid JSON after the name",
        '<tool_call>\n{"name": "x", "arguments": {"a": 1, "b": tru e}}\n</tool_call>',
        (', "b": tru e}}\n</tool_call>', "", [("x", {"a": 1})]),
    ),
    (
        "arguments first",
        '<tool_call>\n{"arguments": {"q": [1, "<tool_call>"]}, "name": "find"}\n</tool_call>',
        ("", "", [("find", {"q": [1, "<tool_call>"]})]),
    ),
    (
        "arguments as a JSON string",
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>',
        ("", "", [("f", {"a": 1})]),
    ),
    (
        "text after the call",
        call("f", {"a": "b"}) + "\n\nDone.",
        ("Done.", "", [("f", {"a": "b"})]),
    ),
    (
        "no close tag, text follows",
        '<tool_call>\n{"name": "f", "arguments": {}} Thanks',
        ("Thanks", "", [("f", {})]),
    ),
    (
        "raw newline inside a string",
        '<tool_call>\n{"name": "w", "arguments": {"code": "a\nb", "k": [ ]}}\n</tool_call>',
        ("", "", [("w", {"code": "a\nb", "k": []})]),
    ),
    (
        "empty name is no call",
        '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',
        ('<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>', "", []),
    ),
    (
        "a name with a line break is text",
        '<tool_call>\n{"name": "Sure, I can help.\nFirst", "arguments": {}}\n</tool_call>',
        ('<tool_call>\n{"name": "Sure, I can help.\nFirst", "arguments": {}}\n</tool_call>', "", []),
    ),
    (
        "a name that no object continues from is text",
        '<tool_call>\n{"name": "Sure" is what I said. <tool_call>{"name": "f", "arguments": {}}</tool_call>',
        ('<tool_call>\n{"name": "Sure" is what I said.', "", [("f", {})]),
    ),
    (
        "a name not a string is text",
        '<tool_call>\n{"name": 12, "arguments": {}}</tool_call>',
        ('<tool_call>\n{"name": 12, "arguments": {}}</tool_call>', "", []),
    ),
    (
        "arguments first with a line break in the name",
        '<tool_call>\n{"arguments": {}, "name": "a\nb"}\n</tool_call>',
        ('<tool_call>\n{"arguments": {}, "name": "a\nb"}\n</tool_call>', "", []),
    ),
    (
        "extra outer keys",
        '<tool_call>{"name": "f", "arguments": {"a": false}, "id": "x"}</tool_call>',
        ("", "", [("f", {"a": False})]),
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_expected_and_chunking_invariant(text: str, expected: tuple) -> None:
    whole = assert_chunking_invariant(MAKE, text)
    assert summary(whole) == expected


@pytest.mark.parametrize("text", [c[1] for c in CASES], ids=[c[0] for c in CASES])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_chunkings(text: str, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert stream(MAKE, chunks_at(text, cuts)) == MAKE().parse_complete(text)


def test_arguments_equal_json_dumps_of_the_dict() -> None:
    """The streamed arguments are one canonical serialisation of what was parsed."""
    message = MAKE().parse_complete(call("write", NESTED))
    assert message.tool_calls[0].arguments == json.dumps(NESTED, ensure_ascii=False)


def test_name_streams_before_arguments_complete() -> None:
    parser = MAKE()
    first = parser.feed('<tool_call>\n{"name": "write", "arguments": {"path": "a", "body": "xx')
    assert [(d.index, d.id, d.name) for d in first.tool_calls] == [(0, "call_0", "write")]
    assert first.tool_calls[0].arguments == '{"path": "a"'
    rest = parser.feed('x"}}\n</tool_call>')
    assert rest.tool_calls[0].arguments == ', "body": "xxx"}'
    assert parser.tool_calls_emitted == 1


def test_feed_after_finish_raises() -> None:
    parser = MAKE()
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_long_argument_streams_in_linear_time() -> None:
    body = "line of code\\n" * 4000  # ~56k characters of JSON string
    text = '<tool_call>\n{"name": "w", "arguments": {"body": "' + body + '"}}\n</tool_call>'
    got = stream(MAKE, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert json.loads(got.tool_calls[0].arguments)["body"] == "line of code\n" * 4000


def test_lone_surrogate_stays_escaped() -> None:
    """Arguments must encode as UTF-8 for the HTTP body even if the model wrote junk."""
    text = '<tool_call>{"name": "f", "arguments": {"a": "x\\ud83d", "b": "é"}}</tool_call>'
    args = MAKE().parse_complete(text).tool_calls[0].arguments
    args.encode("utf-8")
    assert json.loads(args) == {"a": "x\ud83d", "b": "é"}


def test_prose_after_a_forced_opening_streams_at_its_first_line_break() -> None:
    """A forced call's opening primes the parser inside a name (docs/api.md, "Forced tool
    calls"); prose written there is text as soon as it can't be a name, not at the end."""
    parser = MAKE()
    assert parser.feed('<tool_call>\n{"name": "Sure, I can').content == ""  # may still be a name
    first = parser.feed(" help.\nFirst, the weather")
    assert first.content.startswith('<tool_call>\n{"name": "Sure, I can help.\nFirst')
    assert parser.feed(" in Paris.").content == " in Paris."
    long_name = MAKE()
    assert long_name.feed('<tool_call>{"name": "' + "x" * 12 * MAX_NAME).content == ""
    assert long_name.feed("x").content.startswith("<tool_call>")  # past any name's JSON text


def test_plausible_names() -> None:
    assert plausible_name("get_weather") and plausible_name("mcp__github__create_issue") and plausible_name("Read")
    assert not plausible_name("") and not plausible_name("  ") and not plausible_name("a\nb")
    assert plausible_name("x" * MAX_NAME) and not plausible_name("x" * (MAX_NAME + 1))
