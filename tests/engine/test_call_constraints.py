"""Hermes tool calls held to their tools' schemas through the engine
(`StructuredOutput(target="calls")`) on the tiny random Qwen3: whatever the random model
writes around them, every call it opens and closes is `{"name", "arguments"}` for one of
the tools with arguments valid for that tool (checked by `jsonschema_rs`)."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from tokenizers import Tokenizer

from edgemoe import LLM, SamplingParams, StructuredOutput
from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
from edgemoe.structured.call_schema import call_schema

PROMPT = [151644, 872, 198, 3838, 374, 279]
OPEN, CLOSE = 151657, 151658  # <tool_call>, </tool_call>
LIGHT = {"type": "object", "properties": {"on": {"type": "boolean"}, "level": {"type": "integer"},
                                          "room": {"enum": ["hall", "kitchen", None]}},
         "required": ["on", "room"], "additionalProperties": False}
SCENE = {"type": "object", "properties": {"lights": {"type": "array", "items": {"$ref": "#/$defs/l"}, "maxItems": 2}},
         "required": ["lights"], "$defs": {"l": {"type": "object", "properties": {"id": {"type": "integer"}},
                                                  "required": ["id"], "additionalProperties": False}}}
TOOLS = {"set_light": LIGHT, "scene": SCENE}
CALLS = json.dumps(call_schema(list(TOOLS.items())))


@pytest.fixture(scope="module")
def llm(qwen3_ckpt):  # noqa: ANN001, ANN201
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=True) as llm:
        yield llm


def calls_in(token_ids: list[int]) -> tuple[list[str], bool]:
    """The text of each closed call, and whether a call was left open (cut by max_tokens)."""
    decode = Tokenizer.from_file(str(qwen3_tokenizer_json())).decode
    closed, current = [], None
    for t in token_ids:
        if t == OPEN and current is None:
            current = []
        elif t == CLOSE and current is not None:
            closed.append(decode(current, skip_special_tokens=False))
            current = None
        elif current is not None:
            current.append(t)
    return closed, current is not None


def assert_valid_call(text: str) -> None:
    call = json.loads(text)
    assert list(call) == ["name", "arguments"] and call["name"] in TOOLS, text
    assert jsonschema_rs.validator_for(TOOLS[call["name"]]).is_valid(call["arguments"]), text


def test_calls_the_model_opens_are_valid(llm: LLM) -> None:
    """logit_bias makes the random model open a call at every chance it has."""
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=160, logit_bias={OPEN: 30.0},
                             structured=StructuredOutput(schema=CALLS, target="calls")) for seed in range(5)]
    closed = []
    for out in llm.generate([PROMPT] * len(params), params):
        calls, _ = calls_in(out.token_ids)
        closed += calls
    assert len(closed) >= 4
    for text in closed:
        assert_valid_call(text)


def test_a_primed_call_continues_its_opening(llm: LLM) -> None:
    """`tool_choice` "required": the prompt ends with `<tool_call>\\n{"name": "`."""
    opening = Tokenizer.from_file(str(qwen3_tokenizer_json())).encode('\n{"name": "', add_special_tokens=False).ids
    spec = StructuredOutput(schema=CALLS, target="calls", primed='\n{"name": "')
    for temperature in (0.0, 1.0):
        out = llm.generate([PROMPT + [OPEN] + opening], SamplingParams(
            temperature=temperature, seed=4, max_tokens=100, structured=spec))[0]
        calls, _ = calls_in([OPEN] + opening + out.token_ids)
        assert calls, out.text
        assert_valid_call(calls[0])


def test_without_a_call_nothing_is_masked(llm: LLM) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=12, logit_bias={OPEN: -100.0}, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=12, logit_bias={OPEN: -100.0}, ignore_eos=True,
                                 structured=StructuredOutput(schema=CALLS, target="calls"))
    a, b = llm.generate([PROMPT, PROMPT], [plain, constrained])
    assert a.token_ids == b.token_ids


@pytest.mark.parametrize("spec, why", [
    (StructuredOutput(schema=CALLS, target="call"), "target"),
    (StructuredOutput(schema=CALLS, target="calls", primed='{"nom'), "does not start a call"),
])
def test_bad_specs_are_refused(llm: LLM, spec: StructuredOutput, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        llm.generate([PROMPT], SamplingParams(structured=spec))


def test_overlap_goes_on_through_a_think_block(qwen3_ckpt, llm: LLM, monkeypatch) -> None:  # noqa: ANN001
    """A tool-call constraint inside a think block doesn't make overlap scheduling complete
    each step first (its masks are None whatever comes); once the block closes it does.
    The tokens are the serial loop's either way."""
    from edgemoe.engine.engine import Engine

    think_open, think_close = 151667, 151668
    spec = StructuredOutput(schema=CALLS, target="calls", reasoning="open")
    thinking = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, logit_bias={think_close: -100.0},
                               structured=spec) for s in range(2)]
    closing = [SamplingParams(temperature=1.0, seed=s, max_tokens=60, logit_bias={think_close: 30.0},
                              structured=spec) for s in range(2)]
    prompt = PROMPT + [think_open]
    waits: list[bool] = []
    needs = Engine.needs_host_tokens
    monkeypatch.setattr(Engine, "needs_host_tokens", lambda self: waits.append(needs(self)) or waits[-1])
    got = [o.token_ids for o in llm.generate([prompt] * 2, thinking)]
    assert len(waits) >= 39 and not any(waits)  # overlap through the whole block
    waits.clear()
    got += [o.token_ids for o in llm.generate([prompt] * 2, closing)]
    assert True in waits and all(ids[0] == think_close for ids in got[2:])
    monkeypatch.undo()
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=False) as serial:
        assert [o.token_ids for o in serial.generate([prompt] * 4, thinking + closing)] == got
