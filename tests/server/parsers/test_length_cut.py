"""Output cut by a length limit (max_tokens, the context) inside a tool call, every format.

`finish(cut=True)`: a call already announced closes with its completed arguments and its
unfinished raw tail is no content; `finish()` (EOS, a stop string: the model ended there)
keeps each format's rule, the raw text as content. Both are chunking-invariant, and at any
cut point a call's arguments are a subset of what the whole output gives (no value cut
short ever reads as whole).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from parsers_harness import MakeParser, check_deltas, counter_ids, maker, single_splits, summary

from edgemoe.server.forced_call import PrimedParser, call_opening
from edgemoe.server.parsers import ResponseParser, ThinkReasoningParser, accumulate, get_tool_parser
from edgemoe.server.parsers.base import ParsedMessage
from edgemoe.server.parsers.ernie45 import AnswerTagResponseParser

PROPS = {"city": {"type": "string"}, "days": {"type": "integer"}, "content": {"type": "string"}}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": PROPS}}}
         for n in ("get_weather", "get_time")]
DS_BEGIN, DS_CALL, DS_SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"
DS_CALL_END, DS_END = "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"
HARMONY_CALL = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
HARMONY_THINK = "<|channel|>analysis<|message|>think<|end|>"


def cut_stream(make: MakeParser, chunks: list[str]) -> ParsedMessage:
    """`chunks` streamed, then `finish(cut=True)`; the stream's shape checked."""
    parser = make()
    deltas = [parser.feed(c) for c in chunks] + [parser.finish(cut=True)]
    check_deltas(deltas)
    return accumulate(deltas)


def cut_invariant(make: MakeParser, text: str) -> ParsedMessage:
    """The cut parse in one shot, equal to every split in two and to char-by-char feeding."""
    whole = make().parse_complete(text, cut=True)
    for chunks in [*single_splits(text), list(text)]:
        assert cut_stream(make, chunks) == whole, chunks
    return whole


# (id, format, text, expected at a length cut, expected at EOS: today's rule)
CASES: list[tuple[str, str, str, tuple[Any, ...], tuple[Any, ...]]] = [
    ("qwen3_coder in a value (the brief's example)", "qwen3_coder",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
     ("", "", [("get_weather", {})]), ("<parameter=city>\nPar", "", [("get_weather", {})])),
    ("qwen3_coder in the second pair's tag", "qwen3_coder",
     "Ok.\n<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=ci",
     ("Ok.", "", [("get_weather", {"days": 3})]), ("Ok.<parameter=ci", "", [("get_weather", {"days": 3})])),
    ("qwen3_coder right after </parameter>: may be a literal one", "qwen3_coder",
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=content>\n"
     "x = '</parameter>",
     ("", "", [("get_weather", {"days": 3})]),
     ("", "", [("get_weather", {"days": 3, "content": "x = '"})])),
    ("qwen3_coder before </tool_call>", "qwen3_coder",
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=city>\nRome\n"
     "</parameter>\n</function>\n</tool_",
     ("", "", [("get_weather", {"days": 3})]), ("", "", [("get_weather", {"days": 3, "city": "Rome"})])),
    ("qwen3_coder broken before the cut stays content", "qwen3_coder",
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=\nso",
     ("<parameter=\nso", "", [("get_weather", {"days": 3})]),
     ("<parameter=\nso", "", [("get_weather", {"days": 3})])),
    ("qwen3_coder before the name: raw text as at EOS", "qwen3_coder", "Ok <tool_call>\n<function=get_wea",
     ("Ok <tool_call>\n<function=get_wea", "", []), ("Ok <tool_call>\n<function=get_wea", "", [])),
    ("hermes in a string", "hermes",
     'Ok.\n<tool_call>\n{"name": "get_weather", "arguments": {"days": 3, "city": "Pa',
     ("Ok.", "", [("get_weather", {"days": 3})]), ('Ok., "city": "Pa', "", [("get_weather", {"days": 3})])),
    ("hermes in a number", "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3',
     ("", "", [("get_weather", {"city": "Paris"})]), (', "days": 3', "", [("get_weather", {"city": "Paris"})])),
    ("hermes after the arguments", "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}, "id": "x',
     ("", "", [("get_weather", {"days": 3})]), (', "id": "x', "", [("get_weather", {"days": 3})])),
    ("hermes before the name", "hermes", '<tool_call>\n{"name": "get_wea',
     ('<tool_call>\n{"name": "get_wea', "", []), ('<tool_call>\n{"name": "get_wea', "", [])),
    ("glm45 in a value", "glm45", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
     "<arg_key>city</arg_key>\n<arg_value>Par",
     ("", "", [("get_weather", {"days": 3})]),
     ("<arg_key>city</arg_key>\n<arg_value>Par", "", [("get_weather", {"days": 3})])),
    ("glm45 in a key", "glm45", "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>ci",
     ("", "", [("get_weather", {"days": 3})]), ("<arg_key>ci", "", [("get_weather", {"days": 3})])),
    ("glm45 before the name", "glm45", "<tool_call>get_wea", ("<tool_call>get_wea", "", []),
     ("<tool_call>get_wea", "", [])),
    ("minimax_m2 in a value", "minimax_m2",
     '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Par',
     ("", "", [("get_weather", {})]), ('<parameter name="city">Par', "", [("get_weather", {})])),
    ("minimax_m2 in the next invoke's tag", "minimax_m2",
     '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="days">3</parameter>\n</invoke>\n'
     '<invoke name="get_ti',
     ("", "", [("get_weather", {"days": 3})]), ('<invoke name="get_ti', "", [("get_weather", {"days": 3})])),
    ("deepseek_v3 in a string", "deepseek_v3", f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"days": 3, "city": "Pa',
     ("", "", [("get_weather", {"days": 3})]), (', "city": "Pa', "", [("get_weather", {"days": 3})])),
    ("deepseek_v3 fenced, in a number", "deepseek_v3",
     f'{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Paris", "days": 3',
     ("", "", [("get_weather", {"city": "Paris"})]), (', "days": 3', "", [("get_weather", {"city": "Paris"})])),
    ("deepseek_v3 in the next call's head", "deepseek_v3",
     f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"days": 3}}{DS_CALL_END}{DS_CALL}get_ti',
     ("", "", [("get_weather", {"days": 3})]), (f"{DS_CALL}get_ti", "", [("get_weather", {"days": 3})])),
    ("deepseek_v3 before the name", "deepseek_v3", f"{DS_BEGIN}{DS_CALL}get_wea",
     (f"{DS_BEGIN}{DS_CALL}get_wea", "", []), (f"{DS_BEGIN}{DS_CALL}get_wea", "", [])),
    ("harmony in a number", "harmony", f'{HARMONY_THINK}{HARMONY_CALL}{{"city": "Paris", "days": 3',
     ("", "think", [("get_weather", {"city": "Paris"})]),
     (', "days": 3', "think", [("get_weather", {"city": "Paris"})])),
    ("harmony in a string", "harmony", f'{HARMONY_CALL}{{"content": "def f():\\n    ret',
     ("", "", [("get_weather", {})]), ('"content": "def f():\\n    ret', "", [("get_weather", {})])),
]


@pytest.mark.parametrize(("tool_format", "text", "cut", "eos"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cut_inside_a_call(tool_format: str, text: str, cut: tuple[Any, ...], eos: tuple[Any, ...]) -> None:
    make = maker(tool_format, TOOLS)
    assert summary(cut_invariant(make, text)) == cut
    assert summary(make().parse_complete(text)) == eos  # EOS / a stop string: the raw tail is content


def test_ernie_answer_tags_pass_the_cut_on() -> None:
    """ERNIE's pipeline (answer tags around the content, Hermes calls) tells its tool stage too."""
    def make() -> ResponseParser:
        return AnswerTagResponseParser(ThinkReasoningParser(starts_in_reasoning=True),
                                       get_tool_parser("hermes")(TOOLS, counter_ids()))
    text = 'p</think>\n\n<response>\nSure.\n</response>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Ro'
    assert summary(cut_invariant(make, text)) == ("Sure.", "p", [("get_time", {})])
    assert summary(make().parse_complete(text)) == ('Sure.\n</response>"city": "Ro', "p", [("get_time", {})])


# Whole outputs, two calls each, values holding their format's closing tags: every prefix is a cut.
WHOLE = {
    "hermes": 'Ok.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 31, '
              '"content": "a}\\"</tool_call>"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
              "</tool_call>",
    "qwen3_coder": "Ok.\n<tool_call>\n<function=get_weather>\n<parameter=content>\nx</parameter>\n</function>\ny\n"
                   "</parameter>\n<parameter=days>\n31\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                   "<function=get_time>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
    "glm45": "Ok.\n<tool_call>get_weather\n<arg_key>content</arg_key>\n<arg_value>x</arg_value> y</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>31</arg_value>\n</tool_call>\n<tool_call>get_time\n"
             "<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>",
    "minimax_m2": 'Ok.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="content">x</parameter>'
                  '</invoke>y</parameter>\n<parameter name="days">31</parameter>\n</invoke>\n<invoke name="get_time">'
                  '\n<parameter name="city">Rome</parameter>\n</invoke>\n</minimax:tool_call>',
    "deepseek_v3": f'Ok.{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"content": "}}{DS_CALL_END}", "days": 31}}'
                   f'{DS_CALL_END}{DS_CALL}get_time{DS_SEP}{{"city": "Rome"}}{DS_CALL_END}{DS_END}',
    "harmony": f'{HARMONY_THINK}{HARMONY_CALL}{{"content": "}}", "days": 31}}<|call|>'
               f'<|start|>assistant<|channel|>final<|message|>Done.',
}


ARGUMENT_MARKUP = ("<parameter", "<arg_key>", "<arg_value>", '"city"', '"days"', '"content"')


@pytest.mark.parametrize("tool_format", sorted(WHOLE))
def test_every_cut_keeps_only_whole_values(tool_format: str) -> None:
    """At every cut point: no call's arguments hold a key the whole output doesn't give that
    call, or a different value (no value cut short reads as whole), and streaming agrees."""
    make = maker(tool_format, TOOLS)
    text = WHOLE[tool_format]
    full = summary(make().parse_complete(text))[2]
    assert [name for name, _ in full] == (["get_weather"] if tool_format == "harmony" else ["get_weather", "get_time"])
    for end in range(len(text) + 1):
        prefix = text[:end]
        got = make().parse_complete(prefix, cut=True)
        assert cut_stream(make, list(prefix)) == got, prefix
        calls = summary(got)[2]
        assert [name for name, _ in calls] == [name for name, _ in full[: len(calls)]], prefix
        for (_, args), (_, whole_args) in zip(calls, full):
            assert all(whole_args.get(k, object()) == v for k, v in args.items()), (prefix, args)
        # No argument's markup is content (a call's head before its name was announced may be).
        assert not any(tag in got.content for tag in ARGUMENT_MARKUP), prefix


# --------------------------------------------------------------------------- forced calls

# (format, named?, what the model wrote after the opening, calls at a length cut)
FORCED = [
    ("qwen3_coder", True, "<parameter=city>\nPar", [("get_weather", {})]),
    ("qwen3_coder", False, "=get_wea", []),
    ("hermes", True, ' {"days": 3, "city": "Pa', [("get_weather", {"days": 3})]),
    ("hermes", True, " ", []),
    ("hermes", False, "get_wea", []),
    ("hermes", True, " I would rather not", []),
    ("glm45", True, "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>ci", [("get_weather", {"days": 3})]),
    ("glm45", True, "<arg_", []),
    ("glm45", False, "get_wea", []),
    ("deepseek_v3", True, '{"city": "Pa', [("get_weather", {})]),
    ("deepseek_v3", False, "get_wea", []),
    ("minimax_m2", True, '<parameter name="city">Par', [("get_weather", {})]),
    ("minimax_m2", False, "get_wea", []),
    ("harmony", True, '{"city": "Pa', [("get_weather", {})]),
    ("harmony", False, ".get_wea", []),
]


def primed(tool_format: str, named: bool) -> MakeParser:
    return lambda: PrimedParser(get_tool_parser(tool_format)(TOOLS, counter_ids()),
                                call_opening(tool_format, "get_weather" if named else None))


@pytest.mark.parametrize(("tool_format", "named", "rest", "calls"), FORCED)
def test_forced_call_cut(tool_format: str, named: bool, rest: str, calls: list[Any]) -> None:
    """A forced call cut by the length limit: after its name, closed with the completed
    arguments; before, nothing (the opening and an unfinished name are no message)."""
    make = primed(tool_format, named)
    for chunks in [*single_splits(rest), list(rest)]:
        parser = make()
        deltas = [parser.opening, *(parser.feed(c) for c in chunks), parser.finish(cut=True)]
        check_deltas(deltas)
        got = accumulate(deltas)
        assert summary(got) == ("", "", calls), chunks


def test_forced_call_eos_keeps_the_raw_text() -> None:
    """EOS right there (the model broke the format): the raw text, opening included, is content."""
    parser = primed("qwen3_coder", False)()
    got = accumulate([parser.opening, parser.feed("=get_wea"), parser.finish()])
    assert summary(got) == ("<tool_call>\n<function=get_wea", "", [])


def test_streamed_arguments_are_a_prefix_of_the_final_ones() -> None:
    """What was streamed before the cut stays: the finish only adds the closing brace."""
    parser = maker("qwen3_coder", TOOLS)()
    head = parser.feed("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=c")
    tail = parser.finish(cut=True)
    assert [(d.name, d.arguments) for d in head.tool_calls] == [("get_weather", '{"days": 3')]
    assert [d.arguments for d in tail.tool_calls] == ["}"] and tail.content == ""
    assert json.loads("".join(d.arguments for d in head.tool_calls + tail.tool_calls)) == {"days": 3}
