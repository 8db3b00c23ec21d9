"""Qwen3-Coder XML tool calls: documented outputs, literal tags in values, chunking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsers_harness import assert_chunking_invariant, chunks_at, maker, stream, summary

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "line": {"type": ["integer", "null"]},
                    "scale": {"type": "number"},
                    "dry_run": {"type": "boolean"},
                    "opts": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
]
MAKE = maker("qwen3_coder", TOOLS)


def call(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# The example the Qwen3-Coder / Qwen3.5 chat template shows the model, verbatim.
TEMPLATE_EXAMPLE = (
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>"
)
CODE = 'def f():\n    return "</function>"  # </parameter>\n\n<tool_call> x'

CASES = [
    ("plain", "Just text, no tools.\n", ("Just text, no tools.\n", "", [])),
    (
        "template example",
        "I'll call it.\n\n" + TEMPLATE_EXAMPLE,
        (
            "I'll call it.",
            "",
            [
                (
                    "example_function_name",
                    {
                        "example_parameter_1": "value_1",
                        "example_parameter_2": "This is the value for the second parameter\n"
                        "that can span\nmultiple lines",
                    },
                )
            ],
        ),
    ),
    (
        "typed two calls",
        call("get_weather", [("city", "San Francisco"), ("days", "3"), ("unit", "celsius")])
        + "\n"
        + call(
            "edit",
            [("line", "null"), ("scale", "2.0"), ("dry_run", "False"), ("opts", "{'a': True}"),
             ("tags", '["x", "ü"]'), ("path", "007")],
        ),
        (
            "",
            "",
            [
                ("get_weather", {"city": "San Francisco", "days": 3, "unit": "celsius"}),
                ("edit", {"line": None, "scale": 2, "dry_run": False, "opts": {"a": True},
                          "tags": ["x", "ü"], "path": "007"}),
            ],
        ),
    ),
    (
        "literal closing tags in a value",
        call("edit", [("content", CODE), ("path", "a.py")]),
        ("", "", [("edit", {"content": CODE, "path": "a.py"})]),
    ),
    (
        "closing tags plus text in a value",
        call("edit", [("content", "a</parameter>\n</function>\nmore"), ("path", "p")]),
        ("", "", [("edit", {"content": "a</parameter>\n</function>\nmore", "path": "p"})]),
    ),
    (
        "value keeps inner newlines",
        call("edit", [("content", "\n\nx\n\n")]),
        ("", "", [("edit", {"content": "\n\nx\n\n"})]),
    ),
    (
        "unknown tool: JSON else raw",
        call("other", [("n", "42"), ("s", "hello world"), ("o", '{"k": [1]}')]),
        ("", "", [("other", {"n": 42, "s": "hello world", "o": {"k": [1]}})]),
    ),
    (
        "no parameters",
        "<tool_call>\n<function=list_files>\n</function>\n</tool_call>",
        ("", "", [("list_files", {})]),
    ),
    (
        "unfinished value at stop",
        "Ok.\n<tool_call>\n<function=edit>\n<parameter=path>\nb.py\n</parameter>\n"
        "<parameter=content>\nprint(",
        ("Ok.<parameter=content>\nprint(", "", [("edit", {"path": "b.py"})]),
    ),
    (
        "stop after </function>",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>",
        ("", "", [("get_weather", {"days": 2})]),
    ),
    (
        "stop cuts </parameter>'s lookahead",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</fun",
        ("", "", [("get_weather", {"days": 2})]),
    ),
    (
        "unfinished before the name",
        "Ok <tool_call>\n<function=get_wea",
        ("Ok <tool_call>\n<function=get_wea", "", []),
    ),
    (
        "prose mentions the tag",
        "Use <tool_call> then <function=NAME> on one line.",
        ("Use <tool_call> then <function=NAME> on one line.", "", []),
    ),
    (
        "text after the call",
        call("get_weather", [("city", "Oslo")]) + "\n\nDone.",
        ("Done.", "", [("get_weather", {"city": "Oslo"})]),
    ),
    (
        # "oops" means that </parameter> did not close the value, and nothing later
        # does: the call keeps no parameters and the raw text is content.
        "garbage after a parameter",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\noops</function>\n</tool_call>",
        ("<parameter=a>\n1\n</parameter>\noops</function>\n</tool_call>", "", [("f", {})]),
    ),
    (
        "garbage instead of a parameter",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
        "<parameter=b>\n2\n</parameter> hm",
        ("<parameter=b>\n2\n</parameter> hm", "", [("f", {"a": 1})]),
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


def test_types_are_exact() -> None:
    """1 == 1.0 == True in Python: check the JSON text, not just equality."""
    text = call("edit", [("scale", "2.5"), ("line", "7"), ("dry_run", "TRUE")])
    args = MAKE().parse_complete(text).tool_calls[0].arguments
    assert args == '{"scale": 2.5, "line": 7, "dry_run": true}'


def test_parameters_stream_one_by_one() -> None:
    parser = MAKE()
    head = parser.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>")
    assert [(d.id, d.name, d.arguments) for d in head.tool_calls] == [("call_0", "get_weather", "")]
    nxt = parser.feed("\n<parameter=days>")
    assert [d.arguments for d in nxt.tool_calls] == ['{"city": "Rome"']
    tail = parser.feed("\n5\n</parameter>\n</function>\n</tool_call>")
    assert [d.arguments for d in tail.tool_calls] == [', "days": 5}']
    assert parser.finish().empty
    assert parser.tool_calls_emitted == 1


def test_anthropic_and_flat_tool_shapes_are_typed_too() -> None:
    params = {"properties": {"n": {"type": "string"}}}
    flat = [{"type": "function", "name": "f", "parameters": params}]
    anthropic = [{"name": "f", "input_schema": params}]
    for tools in (flat, anthropic):
        args = maker("qwen3_coder", tools)().parse_complete(call("f", [("n", "12")]))
        assert json.loads(args.tool_calls[0].arguments) == {"n": "12"}


def test_long_value_streams_in_linear_time() -> None:
    body = "x = '</parameter>'\n" * 3000
    text = call("edit", [("content", body)])
    got = stream(MAKE, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert json.loads(got.tool_calls[0].arguments)["content"] == body
