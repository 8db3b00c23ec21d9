"""Structured outputs on the GPU engine (CUDA graphs and overlap on, the GPU defaults):
masks built on the host go to the device with the step; a structured request beside
plain ones changes only its own tokens; sampled outputs that end are valid instances
(jsonschema_rs), and the overlapped engine draws exactly the serial one's tokens; a strict
tool set's calls are valid for their tools."""

from __future__ import annotations

import json

import pytest

from edgemoe import LLM, SamplingParams, StructuredOutput
from edgemoe.structured.call_schema import call_schema

jsonschema_rs = pytest.importorskip("jsonschema_rs")  # carried in .whl (docs/gpu.md)

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
SCHEMA = {"type": "object", "required": ["ok", "tag", "n"], "additionalProperties": False, "properties": {
    "ok": {"type": "boolean"}, "tag": {"enum": ["red", "green", None]}, "n": {"type": "integer"},
    "name": {"type": "string", "maxLength": 4}}}
PLAIN = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def structured(**kw: object) -> SamplingParams:
    return SamplingParams(structured=StructuredOutput(schema=json.dumps(SCHEMA)), max_tokens=160, **kw)  # type: ignore[arg-type]


def test_structured_beside_plain_rows(small_ckpt) -> None:  # noqa: ANN001
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        assert llm.engine.runner.graphs is not None and llm.engine.overlap is not None
        plain = [o.token_ids for o in llm.generate(PROMPTS, [PLAIN] * 3)]
        outs = llm.generate(PROMPTS, [PLAIN, structured(temperature=1.0, seed=4), PLAIN])
        assert [outs[0].token_ids, outs[2].token_ids] == [plain[0], plain[2]]
        validator = jsonschema_rs.validator_for(SCHEMA)
        sampled = llm.generate([PROMPTS[1]] * 6, [structured(temperature=1.0, seed=s) for s in range(6)])
        ended = [o for o in sampled if o.finish_reason == "stop"]
        assert len(ended) >= 3 and all(validator.is_valid(json.loads(o.text)) for o in ended)


def test_overlap_draws_the_serial_tokens(small_ckpt) -> None:  # noqa: ANN001
    params = [structured(temperature=1.0, seed=s) for s in range(3)]
    runs = []
    for overlap in (True, False):
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident", overlap=overlap) as llm:
            runs.append([o.token_ids for o in llm.generate(PROMPTS, params)])
    assert runs[0] == runs[1]


def test_tool_calls_held_to_their_schema(small_ckpt) -> None:  # noqa: ANN001
    """logit_bias opens a call at every chance; each closed call is valid for its tool."""
    open_id, close_id = 151657, 151658  # <tool_call>, </tool_call>
    spec = StructuredOutput(schema=json.dumps(call_schema([("set", SCHEMA)])), target="calls")
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200, logit_bias={open_id: 30.0}, structured=spec)
              for s in range(4)]
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        decode = llm.tokenizer.tokenizer.decode
        validator = jsonschema_rs.validator_for(SCHEMA)
        closed = 0
        for out in llm.generate([PROMPTS[1]] * 4, params):
            ids = out.token_ids
            starts = [i for i, t in enumerate(ids) if t == open_id]
            for a in starts:
                if close_id in ids[a:]:
                    call = json.loads(decode(ids[a + 1:ids.index(close_id, a)], skip_special_tokens=False))
                    assert call["name"] == "set" and validator.is_valid(call["arguments"]), call
                    closed += 1
        assert closed >= 2
