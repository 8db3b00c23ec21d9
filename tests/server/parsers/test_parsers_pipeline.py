"""Registry, the combined pipeline, and fuzzed chunking invariance on random texts."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsers_harness import check_deltas, chunks_at, maker, stream

from edgemoe.server.parsers import (
    TOOL_PARSERS,
    ResponseParser,
    ThinkReasoningParser,
    get_tool_parser,
    parser_for_chat_template,
    parser_for_model_type,
)
from edgemoe.server.parsers.base import ToolParser


def test_registry_names_resolve_to_tool_parsers() -> None:
    assert set(TOOL_PARSERS) == {"hermes", "qwen3_coder", "glm45", "harmony", "deepseek_v3", "minimax_m2"}
    for name in TOOL_PARSERS:
        assert issubclass(get_tool_parser(name), ToolParser)
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")


@pytest.mark.parametrize(
    ("model_type", "name"),
    [("qwen3_moe", "hermes"), ("olmoe", "hermes"), ("mixtral", "hermes"), ("qwen2_moe", "hermes"),
     ("qwen3_5_moe", "qwen3_coder"), ("qwen3_next", "qwen3_coder"), ("qwen4_exp", "qwen3_coder"),
     ("glm4_moe", "glm45"), ("gpt_oss", "harmony"), ("deepseek_v3", "deepseek_v3"), ("minimax_m2", "minimax_m2")],
)
def test_family_defaults(model_type: str, name: str) -> None:
    assert parser_for_model_type(model_type) == name


def test_unknown_family_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError):
        parser_for_model_type("no_such_family")


def test_parser_for_chat_template() -> None:
    coder = "...<tool_call>\n<function=x>\n<parameter=y>..."
    assert parser_for_chat_template(coder) == "qwen3_coder"
    assert parser_for_chat_template('<tool_call>\n{"name": ...}\n</tool_call>') == "hermes"
    assert parser_for_chat_template("{{ messages }}") is None


def test_import_is_lazy_and_torch_free() -> None:
    code = (
        "import sys, edgemoe.server.parsers as p\n"
        "assert 'torch' not in sys.modules\n"
        "assert 'edgemoe.server.parsers.hermes' not in sys.modules\n"
        "p.get_tool_parser('hermes')\n"
        "assert 'edgemoe.server.parsers.hermes' in sys.modules\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tool_calls_emitted_and_deltas() -> None:
    parser = maker("hermes", None, True)()
    out = [parser.feed("x</think>\n\n"), parser.feed('<tool_call>{"name": "a", "arguments": {}}')]
    assert parser.tool_calls_emitted == 1
    out.append(parser.finish())
    check_deltas(out)
    assert [d.reasoning for d in out] == ["x", "", ""]


def test_parse_complete_needs_a_fresh_parser() -> None:
    parser = ResponseParser(ThinkReasoningParser(), None)
    parser.feed("a")
    with pytest.raises(RuntimeError):
        parser.parse_complete("b")
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("c")


# Fragments that exercise every boundary the parsers care about, in random orders.
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "\n", " ", "x", "{", "}", "[", "]",
    '"', "\\", ":", ",", '"name"', '"arguments"', '"a"', "1", "tr", "ue", "null",
    "<function=f>", "</function>", "<parameter=p>", "</parameter>", "<parameter=", "<function=",
    "<tool", "</para", "é", '{"name": "f", "arguments": {', '"k": "v"',
]
CONFIGS = [(t, s) for t in ("hermes", "qwen3_coder", None) for s in (None, True, False)]


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), max_size=30),
    config=st.sampled_from(CONFIGS),
    cuts=st.lists(st.integers(0, 400), max_size=15),
)
def test_fuzz_chunking_invariance(parts: list[str], config: tuple, cuts: list[int]) -> None:
    text = "".join(parts)
    make = maker(config[0], None, config[1])
    cuts = [c for c in cuts if c <= len(text)]
    assert stream(make, chunks_at(text, cuts)) == make().parse_complete(text)
    assert stream(make, list(text)) == make().parse_complete(text)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=30),
       tool=st.sampled_from(["hermes", "qwen3_coder"]))
def test_fuzz_text_without_calls_is_kept(parts: list[str], tool: str) -> None:
    """With no call emitted, every character survives except whitespace around the
    rejected/absent calls' tags — so compare ignoring whitespace."""
    text = "".join(parts)
    message = maker(tool)().parse_complete(text)
    if not message.tool_calls:
        assert "".join(message.content.split()) == "".join(text.split())


# Well-formed responses (reasoning, prose, calls) with random damage: truncation,
# inserted tag fragments, deleted spans. Reaches the in-call states far more often
# than random fragments do.
DAMAGE = ["<tool_call>", "</tool_call>", "</think>", "\n", " ", "{", "}", '"', "\\", ",",
          "</parameter>", "</function>", "<parameter=k>", "<function=f>", "é", "1"]
VALUES = ["1", "2.5", "true", "null", "hi there", "a</parameter>b", "</function>",
          "<tool_call>", "{'a': 1}", '["x"]', "line1\nline2", ""]


def hermes_call(rnd: random.Random) -> str:
    args = {f"k{i}": rnd.choice([1, "s", [1, {"z": None}], "<tool_call>", 'q"\\', {"n": []}])
            for i in range(rnd.randint(0, 3))}
    obj = {"name": rnd.choice(["f", "g"]), "arguments": args}
    if rnd.random() < 0.2:
        obj = {"arguments": args, "name": "h"}
    return "<tool_call>\n" + json.dumps(obj, ensure_ascii=rnd.random() < 0.5) + "\n</tool_call>"


def coder_call(rnd: random.Random) -> str:
    body = "".join(f"<parameter=p{i}>\n{rnd.choice(VALUES)}\n</parameter>\n"
                   for i in range(rnd.randint(0, 3)))
    return f"<tool_call>\n<function={rnd.choice(['f', 'g'])}>\n{body}</function>\n</tool_call>"


def damaged_response(rnd: random.Random, tool: str, thinking: bool) -> str:
    parts = []
    if thinking:
        opening, aside = rnd.choice(["", "<think>\n"]), rnd.choice(["", "<tool_call>"])
        parts.append(f"{opening}plan {aside}\n</think>\n\n")
    for _ in range(rnd.randint(0, 3)):
        parts.append(rnd.choice(["Text. ", "\n", "a <tool_call> b ", ""]))
        parts.append(hermes_call(rnd) if tool == "hermes" else coder_call(rnd))
        parts.append(rnd.choice(["", "\n", "\nDone."]))
    text = "".join(parts)
    for _ in range(rnd.randint(0, 3)):
        i, op = rnd.randint(0, len(text)), rnd.random()
        if op < 0.3:
            text = text[:i]
        elif op < 0.7:
            text = text[:i] + rnd.choice(DAMAGE) + text[i:]
        else:
            text = text[:i] + text[i + rnd.randint(1, 5) :]
    return text


@settings(max_examples=300, deadline=None)
@given(
    rnd=st.randoms(use_true_random=False),
    tool=st.sampled_from(["hermes", "qwen3_coder"]),
    starts=st.sampled_from([None, True, False]),
)
def test_fuzz_damaged_responses(rnd: random.Random, tool: str, starts: bool | None) -> None:
    text = damaged_response(rnd, tool, starts is not None)
    make = maker(tool, None, starts)
    whole = make().parse_complete(text)
    for _ in range(3):
        cuts = [rnd.randint(0, len(text)) for _ in range(rnd.randint(0, 25))]
        assert stream(make, chunks_at(text, cuts)) == whole
