"""gpt-oss's harmony output: channels, calls in both header spellings, malformed text, and
chunking invariance (every split, fuzzed outputs). Expectations are written out from
harmony's published format (openai/harmony docs/format.md), not from the parser."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from parsers_harness import assert_chunking_invariant, chunks_at, maker, stream, summary

from edgemoe.server.parsers.harmony import call_opening, parse_header, template_effort, writable_name

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
MAKE = maker("harmony", TOOLS)
A = "<|start|>assistant"
WEATHER = '{"city": "Paris", "days": 3}'
CALL = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{WEATHER}"
ARGS = json.loads(WEATHER)

CASES: list[tuple[str, str, tuple[str, str, list[Any]]]] = [
    ("answer", "<|channel|>analysis<|message|>Simple.<|end|>" + A + "<|channel|>final<|message|>2 + 2 = 4.",
     ("2 + 2 = 4.", "Simple.", [])),
    ("call", "<|channel|>analysis<|message|>Need it.<|end|>" + A + CALL, ("", "Need it.", [("get_weather", ARGS)])),
    ("history spelling", " to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>",
     ("", "", [("get_time", {})])),
    ("preamble, two calls", "<|channel|>commentary<|message|>Checking both.<|end|>" + A + CALL + "<|call|>" + A
     + '<|channel|>commentary to=get_time<|constrain|>json<|message|>{"zone": "UTC"}',
     ("Checking both.", "", [("get_weather", ARGS), ("get_time", {"zone": "UTC"})])),
    ("call on analysis", "<|channel|>analysis to=functions.get_time<|message|>{}", ("", "", [("get_time", {})])),
    ("built-in tool", "<|channel|>analysis to=python code<|message|>print(1)<|end|>" + A
     + "<|channel|>final<|message|>1", ("1", "print(1)", [])),
    ("unknown bare recipient", "<|channel|>commentary to=someone<|message|>hi", ("hi", "", [])),
    ("plain text", "Just text,\nno header.", ("Just text,\nno header.", "", [])),
    ("plain short", "Hi<|end|>", ("Hi", "", [])),
    ("body no object", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Paris please",
     ("Paris please", "", [])),
    ("args cut off", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris", "days": [3',
     (', "days": [3', "", [("get_weather", {"city": "Paris"})])),
    ("args broken", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris" "days": 3}<|call|>',
     (' "days": 3}', "", [("get_weather", {"city": "Paris"})])),
    ("junk after args", CALL + " extra<|call|>", ("extra", "", [("get_weather", ARGS)])),
    ("space after args", CALL + "\n <|call|>", ("", "", [("get_weather", ARGS)])),
    ("terminator in a string", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "a<|call|>b"}',
     ('"city": "ab"}', "", [("get_weather", {})])),
    ("return ends", "<|channel|>final<|message|>ok<|return|>", ("ok", "", [])),
    ("header without body", "<|channel|>final<|end|>" + A + "<|channel|>final<|message|>x", ("x", "", [])),
    ("no start", "<|channel|>analysis<|message|>a<|end|>\n<|channel|>final<|message|>b", ("b", "a", [])),
    ("cut off in a body", "<|channel|>analysis<|message|>cut " + A + "<|chan", ("", "cut " + A + "<|chan", [])),
    ("cut off in a header", "<|channel|>analysis<|message|>done<|end|>" + A + "<|channel|>fin", ("", "done", [])),
    ("call cut before body", A + CALL[: CALL.index("{")], ("", "", [])),
    ("long header", "x" * 600 + "<|message|>y", ("x" * 600 + "<|message|>y", "", [])),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cases_in_every_chunking(text: str, expected: tuple[str, str, list[Any]]) -> None:
    assert summary(assert_chunking_invariant(MAKE, text, pairs_up_to=80)) == expected


def test_without_tools_no_message_is_a_call() -> None:
    """tool_choice "none" (the parser gets no tools): a function's message is content."""
    text = "<|channel|>analysis<|message|>r<|end|>" + A + CALL
    assert summary(maker("harmony", None)().parse_complete(text)) == (WEATHER, "r", [])


def test_call_streams_as_it_arrives() -> None:
    parser = MAKE()
    head = parser.feed("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{")
    assert [(d.index, d.name, d.arguments) for d in head.tool_calls] == [(0, "get_weather", "")]
    assert parser.feed('"city": "Paris", ').tool_calls[0].arguments == '{"city": "Paris"'
    assert parser.finish().tool_calls[0].arguments == "}" and parser.tool_calls_emitted == 1


def test_headers_and_helpers() -> None:
    assert parse_header(" to=functions.f<|channel|>commentary json") == ("commentary", "functions.f")
    assert parse_header("<|channel|>commentary to=functions.f<|constrain|>json") == ("commentary", "functions.f")
    assert parse_header("assistant<|channel|>final") == ("final", None)
    assert call_opening("f") == "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
    assert call_opening(None) == "<|channel|>commentary to=functions"
    assert writable_name("mcp__fs__read") and not writable_name("a b") and not writable_name("a<|end|>")
    assert [template_effort(e) for e in ("none", "minimal", "Low", "medium", "xhigh")] == [
        "low", "low", "low", "medium", "high"]


TRICKY = ["<", "<|", "|>", "{", "}", '"', "\\", "é", "😀", "\n", " ", "<|end", "to=", "<|message|", "json"]


def _text(rnd: random.Random) -> str:
    """Tricky text without a terminator (one ends a body wherever it stands: not this test's job)."""
    return "".join(rnd.choices(TRICKY + ["word", "Hello."], k=rnd.randint(0, 5))).replace("<|end|>", "(end|>")


def _message(rnd: random.Random) -> tuple[str, str, str, dict[str, Any] | None]:
    """(text, reasoning it gives, content it gives, arguments if a call) for one message."""
    kind = rnd.choice(["analysis", "final", "commentary", "call"])
    if kind != "call":
        body = _text(rnd)
        return f"<|channel|>{kind}<|message|>{body}", body if kind == "analysis" else "", \
            "" if kind == "analysis" else body, None
    args = {f"k{i}{rnd.choice(TRICKY)}": rnd.choice([1, -2.5, None, True, _text(rnd), [1, {"a": "<|"}]])
            for i in range(rnd.randint(0, 3))}
    body = json.dumps(args, ensure_ascii=rnd.random() < 0.5, indent=rnd.choice([None, 1]))
    header = rnd.choice(["<|channel|>commentary to=functions.get_weather <|constrain|>json",
                         " to=functions.get_weather<|channel|>commentary json"])
    return f"{header}<|message|>{body}", "", "", args


def test_fuzzed_outputs() -> None:
    rnd = random.Random(20250805)
    for _ in range(300):
        messages = [_message(rnd) for _ in range(rnd.randint(1, 4))]
        ends = [rnd.choice(["<|end|>", "<|call|>"]) for _ in messages]
        text = "".join(m[0] + end + A for m, end in zip(messages, ends, strict=True))[: -len(A)]
        make = maker("harmony", TOOLS)
        whole = make().parse_complete(text)
        expected = ("".join(m[2] for m in messages), "".join(m[1] for m in messages),
                    [("get_weather", m[3]) for m in messages if m[3] is not None])
        assert summary(whole) == expected, text
        cut = text[: rnd.randint(0, len(text))]  # cut by max_tokens: whatever it is, any chunking agrees
        for piece in (text, cut):
            cuts = [rnd.randint(0, len(piece)) for _ in range(rnd.randint(1, 20))]
            for chunks in (list(piece), chunks_at(piece, cuts)):
                assert stream(make, chunks) == make().parse_complete(piece), chunks
