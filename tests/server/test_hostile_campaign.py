"""Regressions from an adversarial campaign against a live server: requests (and model
outputs) that got a 500 or a failed stream instead of a clean 4xx or a correct answer.

- JSON that Python's `json` will not build (an integer of more than 4300 digits, nesting
  past the recursion limit) in a client's tool-call history or in model output;
- a body past the piecewise-parse size carrying nesting that small bodies are refused.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydantic_core
import pytest
from server_harness import ScriptedEngine, ServerHarness

from edgemoe.server.anthropic_protocol import tool_input
from edgemoe.server.config import ServerConfig
from edgemoe.server.json_body import MAX_NESTING, YIELDING_BYTES, InvalidJSON, parse_json
from edgemoe.server.parsers import ResponseParser, get_tool_parser
from edgemoe.server.parsers.base import accumulate
from edgemoe.tokenizer import TokenizerBundle

BIG_INT = "9" * 5000  # past sys.get_int_max_str_digits() (4300): int() raises ValueError
DEEP = "[" * 1200 + "]" * 1200  # past Python's recursion limit: json.loads raises RecursionError
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "p": {"type": "integer"}, "s": {"type": "number"}, "q": {"type": "array"}}}}}]


@pytest.fixture(scope="module")
def roomy(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    engine = ScriptedEngine(demo_tokenizer, max_model_len=16384)  # room for 5000 digits
    # A larger body limit: the big-body test sends past the piecewise-parse size.
    harness = ServerHarness(engine, engine.ready(demo_dir), ServerConfig(max_body_size=64 * 2**20)).start()
    yield harness
    harness.stop()


def _call(arguments: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


@pytest.mark.parametrize("arguments", [BIG_INT, f'{{"p": {BIG_INT}}}', "[" * 1200, f'{{"q": {DEEP}}}'])
def test_tool_call_history_json_python_cannot_build_is_served(roomy: ServerHarness, arguments: str) -> None:
    # Was a 500: the template's argument normalising caught only JSONDecodeError.
    r = httpx.post(f"{roomy.base_url}/v1/chat/completions", timeout=30,
                   json={"model": "m", "messages": _call(arguments), "max_tokens": 4})
    assert r.status_code == 200, r.text


def _parse(name: str, text: str, step: int | None) -> Any:
    ids = itertools.count()
    parser = ResponseParser(None, get_tool_parser(name)(TOOLS, lambda: f"call_{next(ids)}"))
    if step is None:
        return parser.parse_complete(text)
    deltas = [parser.feed(text[i:i + step]) for i in range(0, len(text), step)] + [parser.finish()]
    return accumulate(deltas)


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", f'<tool_call>\n{{"name": "f", "arguments": {{"q": {DEEP}}}}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "parameters": ' + '{"a":' * 1200 + "1" + "}" * 1200 + "}\n</tool_call>"),
    ("qwen3_coder", f"<tool_call>\n<function=f>\n<parameter=p>\n{BIG_INT}\n</parameter>\n</function>\n</tool_call>"),
    ("qwen3_coder", f"<tool_call>\n<function=f>\n<parameter=s>\n-{BIG_INT}\n</parameter>\n</function>\n</tool_call>"),
])
@pytest.mark.parametrize("step", [None, 7])
def test_parsers_take_model_output_python_json_cannot_build(name: str, text: str, step: int | None) -> None:
    # Was RecursionError (hermes) / ValueError (coder's int()): every protocol answered 500
    # or ended its stream with an error, for output a degenerate model does produce.
    result = _parse(name, text, step)
    assert result == _parse(name, text, None)
    for call in result.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)


def test_coder_keeps_a_too_long_integer_as_text() -> None:
    text = f"<tool_call>\n<function=f>\n<parameter=p>\n{BIG_INT}\n</parameter>\n</function>\n</tool_call>"
    (call,) = _parse("qwen3_coder", text, None).tool_calls
    assert json.loads(call.arguments) == {"p": BIG_INT}


@pytest.mark.parametrize("arguments", [f'{{"p": {BIG_INT}}}', "[" * 1200])
def test_anthropic_tool_input_of_unbuildable_json_is_empty(arguments: str) -> None:
    assert tool_input(arguments) == {}


@pytest.mark.parametrize("opener", ["[", '{"a":'])
@pytest.mark.parametrize("levels", [MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 980])
@pytest.mark.parametrize("where", ["top", "message"])
def test_big_bodies_refuse_the_nesting_small_bodies_refuse(opener: str, levels: int, where: str) -> None:
    closer = "]" if opener == "[" else "}"
    if where == "top":  # levels counts every container, the body's own object too
        small = '{"x": ' + opener * (levels - 1) + "1" + closer * (levels - 1) + "}"
    else:  # a value deep in messages[0].content: parsed whole below the piecewise depth
        small = '{"messages": [{"content": [' + opener * (levels - 4) + "1" + closer * (levels - 4) + "]}]}"
    big = small[:-1] + ', "pad": "' + "a" * YIELDING_BYTES + '"}'

    def accepted(body: str) -> bool:
        try:
            parse_json(body.encode())
        except InvalidJSON:
            return False
        return True

    small_ok = True
    try:
        pydantic_core.from_json(small)
    except ValueError:
        small_ok = False
    assert small_ok == (levels <= MAX_NESTING)
    assert accepted(big) == small_ok


@pytest.mark.parametrize(("path", "field"), [("/v1/responses", "text"), ("/v1/chat/completions", "tools")])
def test_a_big_body_nested_too_deep_is_400(roomy: ServerHarness, path: str, field: str) -> None:
    # Was a 500 on /v1/responses (`text` echoed, the JSON encoder recursed) and a 400
    # quoting Python's RecursionError elsewhere: now the parser's own refusal, as for a small body.
    deep = '{"a":' * 980 + "1" + "}" * 980
    base = ({"model": "m", "input": "hi", "max_output_tokens": 4} if path == "/v1/responses"
            else {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    body = json.dumps({**base, field: "@DEEP@", "pad": "a" * YIELDING_BYTES}).replace('"@DEEP@"', deep)
    r = httpx.post(f"{roomy.base_url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "nested more than 200 deep" in r.json()["error"]["message"]


@pytest.mark.parametrize(("field", "value"), [("conversation", "conv_123"), ("conversation", {"id": "conv_123"}),
                                              ("prompt", {"id": "pmpt_123", "variables": {"x": "y"}})])
@pytest.mark.parametrize("stream", [False, True])
def test_responses_refuses_stored_state_it_does_not_have(scripted: ServerHarness, field: str, value: Any,
                                                         stream: bool) -> None:
    # Was a 200 answered without the stored conversation / prompt, silently; now refused
    # like previous_response_id.
    body = {"model": "m", "input": "hi", "max_output_tokens": 4, "stream": stream, field: value}
    r = httpx.post(f"{scripted.base_url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
