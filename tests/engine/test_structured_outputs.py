"""Structured outputs through the engine (`SamplingParams.structured`) on the tiny random
Qwen3 (its real 151K vocabulary, fp32, CPU): sampled at temperature 1, whatever the random
model prefers, every output that ends is JSON valid against its schema (checked by
`jsonschema_rs`, an independent validator), one cut by `max_tokens` is a prefix the
grammar accepts; the mask touches only its own row; overlap changes nothing."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest

from edgemoe import LLM, SamplingParams, StructuredOutput
from edgemoe.structured import Grammar

PROMPT = [151644, 872, 198, 3838, 374, 279]

# Closed schemas: every value ends after a bounded number of bytes, so random sampling
# finishes (a free string can go on until max_tokens).
SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
                                      "tag": {"enum": ["red", "green", None, 7]}},
     "required": ["ok", "tag"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
                                      "kids": {"type": "array", "maxItems": 2,
                                               "items": {"$ref": "#/$defs/leaf"}}},
     "required": ["name", "kids"], "$defs": {"leaf": {"type": "object", "properties": {
         "v": {"type": "number"}}, "required": ["v"]}}},
]


@pytest.fixture(scope="module")
def llm(qwen3_ckpt):  # noqa: ANN001, ANN201
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=True) as llm:
        yield llm


def structured(schema: object, **kw: object) -> SamplingParams:
    return SamplingParams(structured=StructuredOutput(schema=json.dumps(schema)), **kw)  # type: ignore[arg-type]


def assert_valid_or_prefix(schema: object, text: str, finish_reason: str | None) -> None:
    if finish_reason == "stop":
        assert jsonschema_rs.validator_for(schema).is_valid(json.loads(text)), text
    else:
        grammar = Grammar.from_schema(schema)
        assert grammar.advance_bytes(grammar.start(), text.strip().encode()) is not None, text


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_sampled_outputs_are_valid(llm: LLM, index: int) -> None:
    schema = SCHEMAS[index]
    params = [structured(schema, temperature=1.0, seed=seed, max_tokens=120) for seed in range(6)]
    outs = llm.generate([PROMPT] * len(params), params)
    for out in outs:
        assert_valid_or_prefix(schema, out.text, out.finish_reason)
    assert sum(o.finish_reason == "stop" for o in outs) >= 3  # most end: the schemas are closed


def test_json_object_and_greedy(llm: LLM) -> None:
    p = SamplingParams(temperature=0.0, max_tokens=40, structured=StructuredOutput())
    out = llm.generate([PROMPT], p)[0]
    grammar = Grammar.json_object()
    state = grammar.advance_bytes(grammar.start(), out.text.strip().encode())
    assert state is not None and out.text.lstrip()[:1] == "{"
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)


def test_mask_applies_to_its_own_row_only(llm: LLM) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = llm.generate([PROMPT], plain)[0]
    both = llm.generate([PROMPT, PROMPT], [plain, structured(SCHEMAS[0], temperature=0.0, max_tokens=12)])
    assert both[0].token_ids == alone.token_ids
    assert both[1].text.lstrip().startswith("{")


def test_overlap_changes_nothing(qwen3_ckpt, llm: LLM) -> None:  # noqa: ANN001
    params = [structured(SCHEMAS[2], temperature=1.0, seed=seed, max_tokens=60) for seed in range(3)]
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=False) as serial:
        want = [o.token_ids for o in serial.generate([PROMPT] * 3, params)]
    assert [o.token_ids for o in llm.generate([PROMPT] * 3, params)] == want


def test_overlap_goes_on_through_a_think_block(qwen3_ckpt, llm: LLM, monkeypatch) -> None:  # noqa: ANN001
    """A JSON output after a think block: while the model thinks the engine doesn't wait
    for each token on the host; the mask after the close is picked on the device from the
    token in flight (a close sampled at the first token makes the second the JSON's). The
    tokens are the serial loop's, with the close at once, never, or at random."""
    from edgemoe.engine.engine import Engine

    think_open, think_close = 151667, 151668
    spec = StructuredOutput(schema=json.dumps(SCHEMAS[1]), reasoning="open")
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=30, logit_bias={think_close: bias}, structured=spec)
              for s, bias in enumerate((30.0, 30.0, -100.0, 0.0))]
    prompt = PROMPT + [think_open]
    waits: list[bool] = []
    needs = Engine.needs_host_tokens
    monkeypatch.setattr(Engine, "needs_host_tokens", lambda self: waits.append(needs(self)) or waits[-1])
    outs = llm.generate([prompt] * 4, params)
    monkeypatch.undo()
    got = [o.token_ids for o in outs]
    assert False in waits
    for out in outs[:2]:  # closed at once, then the JSON (an array of "a"/"b") right after
        assert out.token_ids[0] == think_close
        assert_valid_or_prefix(SCHEMAS[1], out.text.split("</think>")[-1], out.finish_reason)
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=False) as serial:
        assert [o.token_ids for o in serial.generate([prompt] * 4, params)] == got


@pytest.mark.parametrize("schema, why", [
    ("{not json", "not JSON"),
    (json.dumps({"type": "object", "not": {}}), "not"),
    (json.dumps({"type": "strin"}), "strin"),
])
def test_bad_schemas_are_refused_by_name(llm: LLM, schema: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        llm.generate([PROMPT], SamplingParams(structured=StructuredOutput(schema=schema)))


def test_reasoning_mode_is_checked(llm: LLM) -> None:
    with pytest.raises(ValueError, match="reasoning"):
        llm.generate([PROMPT], SamplingParams(structured=StructuredOutput(reasoning="later")))


def test_min_tokens_after_a_complete_value_keeps_the_mask(llm: LLM) -> None:
    """`1` is complete with nothing after it but EOS, which min_tokens bans: the row has no
    token left, and the sampler's fallback must still take the mask's (EOS), not the raw
    argmax (any token, breaking the JSON)."""
    for temperature in (0.0, 1.0):
        p = structured({"const": 1}, temperature=temperature, seed=3, min_tokens=6, max_tokens=12)
        out = llm.generate([PROMPT], p)[0]
        assert out.text.strip() == "1", out.text
        assert out.finish_reason == "stop"
