"""Hypothesis fuzzing of what clients control: request bodies through the request models,
the protocol conversion, the chat template and the checks; and model output with any
text and any tool definitions through the parsers.

The contract under test: odd input is refused with a 4xx `APIError` (or a pydantic
validation error, which the app turns into 400), never any other exception; parsers
never raise, and streaming any split of the text gives the one-shot result.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from edgemoe.messages import EngineReady
from edgemoe.server.config import ServerConfig
from edgemoe.server.errors import APIError
from edgemoe.server.generation import check_request, render_prompt
from edgemoe.server.model import ServedModel
from edgemoe.server.openai_chat import to_generation_request as chat_request
from edgemoe.server.openai_completions import (
    to_generation_request as completion_request,
)
from edgemoe.server.parsers import ResponseParser, ThinkReasoningParser, get_tool_parser
from edgemoe.server.parsers.base import accumulate
from edgemoe.server.protocol import ChatCompletionRequest, CompletionRequest

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
        "</parameter>", '{"name": "f", "arguments": {', "}", "\n", "{{", "{%", "<|im_start|>", "<|im_end|>"]
texts = st.one_of(st.text(max_size=60), st.sampled_from(TAGS),
                  st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=8)), max_size=8).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@st.composite
def damaged(draw: st.DrawFn, bodies: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A well-typed body; one time in three, one field (or one message) replaced by any JSON."""
    body = draw(bodies)
    if draw(st.integers(0, 2)) == 0:
        key = draw(st.sampled_from(sorted(body)))
        if key == "messages" and body["messages"] and draw(st.booleans()):
            body["messages"][draw(st.integers(0, len(body["messages"]) - 1))] = draw(json_values)
        else:
            body[key] = draw(json_values)
    return body


content_parts = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_text", "x"]), "text": maybe(texts)}),
    texts), max_size=3)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"])},
    optional={"content": st.one_of(st.none(), texts, content_parts), "tool_call_id": maybe(texts),
              "tool_calls": maybe(st.lists(st.fixed_dictionaries({"id": texts, "type": st.just("function"),
                                                                  "function": st.fixed_dictionaries({
                                                                      "name": texts, "arguments": texts})}),
                                           max_size=2)),
              "name": maybe(texts), "reasoning_content": maybe(texts)},
), min_size=1, max_size=4)
tool_defs = st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(["function", "custom"]),
    "function": st.fixed_dictionaries({"name": texts}, optional={
        "parameters": maybe(st.dictionaries(texts, json_values, max_size=3)), "description": maybe(texts)}),
}), max_size=3)
chat_bodies = damaged(st.fixed_dictionaries({"messages": messages}, optional={
    "model": maybe(texts), "tools": maybe(tool_defs), "max_tokens": maybe(st.integers(-5, 50)),
    "n": st.integers(-1, 4), "temperature": maybe(st.floats(-1, 3)), "top_p": maybe(st.floats(-1, 2)),
    "stop": maybe(st.one_of(texts, st.lists(texts, max_size=3))), "logprobs": st.booleans(),
    "top_logprobs": maybe(st.integers(-1, 25)), "tool_choice": maybe(st.one_of(
        st.sampled_from(["none", "auto", "required"]), st.fixed_dictionaries({"function": st.fixed_dictionaries(
            {"name": texts})}))),
    "chat_template_kwargs": maybe(st.dictionaries(texts, json_values, max_size=3)),
    "reasoning_effort": maybe(texts), "stop_token_ids": maybe(st.lists(st.integers(-5, 2**40), max_size=3)),
    "seed": maybe(st.integers(-2**70, 2**70)), "min_tokens": maybe(st.integers(-2, 60)),
}))


@pytest.fixture(scope="module")
def served(demo_dir: Path) -> ServedModel:
    info = EngineReady(model_dir=str(demo_dir), model_type="qwen3_moe", max_model_len=512, vocab_size=151936,
                       eos_token_ids=[151643, 151645], pid=0)
    return ServedModel.load(info, ServerConfig())


def _through_the_core(model: ServedModel, convert: Any, req: Any) -> None:
    try:
        gen = convert(req, model)
        prompt = render_prompt(model, gen, thinking=True)
        check_request(model, gen, prompt)
        event("accepted")
    except APIError as err:
        assert 400 <= err.status < 500, err.message
        event(f"refused: {err.param}")


@FUZZ
@given(body=chat_bodies)
def test_fuzz_chat_requests_are_served_or_refused_cleanly(served: ServedModel, body: dict[str, Any]) -> None:
    try:
        req = ChatCompletionRequest.model_validate(json.loads(json.dumps(body, default=str)))
    except ValidationError:
        event("invalid")
        return  # the app answers 400
    _through_the_core(served, chat_request, req)


completion_bodies = damaged(st.fixed_dictionaries({"prompt": st.one_of(
    texts, st.lists(st.integers(-3, 2**40), max_size=6), st.lists(texts, max_size=2),
    st.lists(st.lists(st.integers(-3, 300000), max_size=4), max_size=2))}, optional={
    "echo": st.booleans(), "logprobs": maybe(st.integers(-1, 25)), "suffix": maybe(texts),
    "best_of": maybe(st.integers(-1, 3)), "max_tokens": maybe(st.integers(-3, 600)), "n": st.integers(0, 3),
}))


@FUZZ
@given(body=completion_bodies)
def test_fuzz_completion_requests_are_served_or_refused_cleanly(served: ServedModel, body: dict[str, Any]) -> None:
    try:
        req = CompletionRequest.model_validate(json.loads(json.dumps(body, default=str)))
    except ValidationError:
        event("invalid")
        return
    _through_the_core(served, completion_request, req)


# --------------------------------------------------------------------------- parsers

# Tool specs as the request models let them through (dicts, names are strings), with
# anything at all as their parameter schemas: the coder parser types values by them.
schemas = st.dictionaries(st.sampled_from(["type", "properties", "items", "enum", "anyOf", "p", "required"]),
                          json_values, max_size=4)
parser_tools = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g", "x y"])}, optional={"parameters": schemas})}),
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(["f", "g"]),
                           "parameters": st.fixed_dictionaries({"properties": st.dictionaries(
                               st.sampled_from(["p", "k"]), st.one_of(schemas, json_values), max_size=2)})}),
    st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]), "input_schema": schemas}),
), max_size=3)


def _parser(name: str, tools: list[Any], reasoning: bool | None) -> ResponseParser:
    ids = itertools.count()
    tool = get_tool_parser(name)(tools, lambda: f"call_{next(ids)}")
    think = ThinkReasoningParser(starts_in_reasoning=reasoning) if reasoning is not None else None
    return ResponseParser(think, tool)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.lists(st.one_of(st.sampled_from(TAGS + ["<parameter=p>", "<function=f>", "f", "1", '"'] * 2),
                            st.text(max_size=12)), max_size=25).map("".join),
    tools=parser_tools,
    name=st.sampled_from(["hermes", "qwen3_coder"]),
    reasoning=st.sampled_from([None, True, False]),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_fuzz_parsers_take_any_text_and_any_tools(
    text: str, tools: list[Any], name: str, reasoning: bool | None, cuts: list[int]
) -> None:
    whole = _parser(name, tools, reasoning).parse_complete(text)
    for call in whole.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
    points = [0, *sorted({c for c in cuts if c <= len(text)}), len(text)]
    parser = _parser(name, tools, reasoning)
    deltas = [parser.feed(text[a:b]) for a, b in zip(points, points[1:])] + [parser.finish()]
    assert accumulate(deltas) == whole
