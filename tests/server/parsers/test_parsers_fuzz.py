"""Adversarial outputs (fixed seeds): streamed == one-shot, arguments strict JSON, and
well-formed calls parse to exactly what the model wrote; plus the defects it found."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from parsers_harness import chunks_at, maker, stream, summary

from edgemoe.tool_values import convert_value

PROPERTIES = {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
    "u": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}
TOOLS = [{"type": "function",
          "function": {"name": "f", "parameters": {"type": "object", "properties": PROPERTIES}}}]
WS = " \t\r\n"
# Pieces of JSON strings / raw values / prose that collide with the formats' syntax.
TRICKY = ["</tool_call>", "<tool_call>", "<", ">", "{", "}", '"', "\\", "é", "😀", "\u2028",
          "</think>", "</parameter>", "</function>", "\x00", "\t", "\n", " "]
CODE = ["if a < b and c > d:\n    return '<x>'\n", "a</parameter>b", "</function>", "<parameter",
        "é😀", "  spaced  ", "\n", "\\", '"q"', "<tool_call>", "</tool_call>", "1e400"]
PROSE = ["Hello.", "a < b", "x<y>z", "<tool_", "<tool_call ", "é😀", "<", "a<\n>b", " ", "\n",
         '{"name": "f"}', "<function=f>", "</think>", ""]
THINK = ["", "<think>\n", "<think></think>", "plan <tool_call>{\"name\": \"f\", \"arguments\": {}}"
         "</tool_call>\n</think>\n\n", "<think>\n<tool_call>\n<function=f>\n</function>\n"
         "</tool_call>\n</think>\n\n"]


def strict_object(text: str) -> dict[str, Any]:
    """What a strict client (JavaScript's JSON.parse) accepts: no NaN/Infinity tokens."""
    def refuse(name: str) -> Any:
        raise ValueError(name)

    value = json.loads(text, parse_constant=refuse)
    assert isinstance(value, dict)
    text.encode("utf-8")  # no lone surrogates
    return value


def json_value(rnd: random.Random, depth: int = 0) -> Any:
    roll = rnd.random()
    if depth > 2 or roll < 0.4:
        return rnd.choice([1, -2.5, 1e20, 10**30, True, None,
                           "".join(rnd.choices(TRICKY, k=rnd.randint(0, 4)))])
    if roll < 0.7:
        size = rnd.randint(0, 3)
        return {rnd.choice(TRICKY) + str(i): json_value(rnd, depth + 1) for i in range(size)}
    return [json_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]


def hermes_call(rnd: random.Random) -> tuple[str, dict[str, Any]]:
    args = {f"k{i}{rnd.choice(TRICKY)}": json_value(rnd) for i in range(rnd.randint(0, 3))}
    roll = rnd.random()
    obj: dict[str, Any] = {"name": "f", "arguments": args}
    if roll < 0.15:
        obj = {"arguments": args, "name": "f"}
    elif roll < 0.3:
        obj = {"name": "f", "arguments": json.dumps(args)}
    elif roll < 0.4:
        obj = {"name": "f", "arguments": args, "id": json_value(rnd)}
    text = json.dumps(obj, ensure_ascii=rnd.random() < 0.5, indent=rnd.choice([None, 1]))
    return f"<tool_call>{rnd.choice(['', chr(10)])}{text}\n</tool_call>", args


def coder_value(rnd: random.Random, key: str) -> tuple[str, Any]:
    """(raw text the model writes, the value it must become under TOOLS' schema)."""
    if key == "s":
        raw = "".join(rnd.choices(CODE, k=rnd.randint(0, 4)))
        return raw, raw
    value = {"i": rnd.choice([0, -3, 10**25]), "n": rnd.choice([2.5, -1e-3]),
             "b": rnd.choice([True, False]), "u": rnd.choice([None, 5]),
             "o": {"k": [1, None], "s": "</parameter>\n<parameter=x>"},
             "a": [1, "a</function>", {"q": "<"}]}[key]
    return json.dumps(value, ensure_ascii=rnd.random() < 0.5), value


def coder_call(rnd: random.Random) -> tuple[str, dict[str, Any]]:
    args: dict[str, Any] = {}
    body = ""
    for key in rnd.sample("sinbuoa", rnd.randint(0, 4)):
        raw, args[key] = coder_value(rnd, key)
        body += f"<parameter={key}>\n{raw}\n</parameter>\n"
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>", args


def response(rnd: random.Random, tool: str) -> tuple[str, str, list[dict[str, Any]]]:
    """(output, expected content, expected arguments): prose around and between calls,
    whitespace next to a call dropped (the parsers' documented convention)."""
    parts, prose, calls = [], [], []
    for _ in range(rnd.randint(0, 3)):
        text, args = (hermes_call if tool == "hermes" else coder_call)(rnd)
        prose.append(rnd.choice(PROSE))
        parts += [prose[-1], rnd.choice(["", "\n", " "]), text, rnd.choice(["", "\n"])]
        calls.append(args)
    prose.append(rnd.choice(PROSE))
    parts.append(prose[-1])
    edges = [p.lstrip(WS) if i else p for i, p in enumerate(prose)]
    content = "".join(p.rstrip(WS) if i < len(edges) - 1 else p for i, p in enumerate(edges))
    return "".join(parts), content, calls


@pytest.mark.parametrize("tool", ["hermes", "qwen3_coder"])
def test_fuzz_adversarial_outputs(tool: str) -> None:
    rnd = random.Random(20240611)
    for _ in range(400):
        text, content, calls = response(rnd, tool)
        thinking = rnd.choice([None, True, False])
        if thinking is not None:
            text = rnd.choice(THINK) + text
        cut = rnd.random() < 0.3
        if cut:
            text = text[: rnd.randint(0, len(text))]  # cut by max_tokens
        make = maker(tool, TOOLS, thinking)
        whole = make().parse_complete(text)
        for call in whole.tool_calls:
            strict_object(call.arguments)
        if thinking is None and not cut:
            assert (whole.content, [json.loads(c.arguments) for c in whole.tool_calls]) == (
                content, calls), text
        cuts = [rnd.randint(0, len(text)) for _ in range(rnd.randint(1, 20))]
        for chunks in (list(text), chunks_at(text, cuts)):
            assert stream(make, chunks) == whole, chunks


# 1e400 is a valid JSON number that float() turns into inf, and json.dumps writes inf as
# the non-JSON token Infinity: arguments that strict clients (JSON.parse) reject.
def test_hermes_overflowing_number_is_not_written_as_infinity() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"z": 1.5, "a": 1e400}}</tool_call>'
    for chunks in ([text], list(text)):
        message = stream(maker("hermes"), chunks)
        assert summary(message) == (', "a": 1e400}}</tool_call>', "", [("f", {"z": 1.5})])
        strict_object(message.tool_calls[0].arguments)
    whole = '<tool_call>{"arguments": {"a": [-1E999]}, "name": "f"}</tool_call>'
    assert maker("hermes")().parse_complete(whole).tool_calls == []  # not-a-call: text


def test_qwen3_coder_overflowing_number_stays_text() -> None:
    params = [("n", "1e400"), ("o", '{"x": -1e400}'), ("a", "[1e400]"), ("zz", "1E999")]
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    text = f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"
    for tools in (TOOLS, None):
        message = maker("qwen3_coder", tools)().parse_complete(text)
        assert strict_object(message.tool_calls[0].arguments) == dict(params)
    assert convert_value("-1e400", None) == "-1e400"
