"""Overlap scheduling with structured requests in every phase, against the serial loop:
requests arrive at random steps into a 3-row engine (page-table rows reused), mixing JSON
outputs that think first or don't, a JSON output beside tool calls, tool-call constraints
and plain rows, with think-close biases that close a block at once, at random or never,
min_tokens and stop strings. Every token and finish reason is the serial loop's, while
masks after a think block's close are picked on the device from the token in flight."""

from __future__ import annotations

import json
import random

import pytest

from edgemoe import LLM, SamplingParams, StructuredOutput
from edgemoe.structured.call_schema import call_schema
from edgemoe.structured.constraint import OutputConstraint

PROMPT = [151644, 872, 198, 3838, 374, 279]
THINK_OPEN, THINK_CLOSE = 151667, 151668
ARRAY = {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}
OBJECT = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}, "required": ["ok"],
          "additionalProperties": False}
CALLS = json.dumps(call_schema([("set_light", {"type": "object", "properties": {"on": {"type": "boolean"}},
                                                "required": ["on"], "additionalProperties": False})]))


def spec(kind: str | None, reasoning: str, rng: random.Random) -> StructuredOutput | None:
    if kind == "json":
        return StructuredOutput(schema=json.dumps(rng.choice([ARRAY, OBJECT])), reasoning=reasoning)
    if kind == "json or calls":
        return StructuredOutput(schema=json.dumps(OBJECT), reasoning=reasoning, calls_schema=CALLS)
    if kind == "calls":
        return StructuredOutput(schema=CALLS, target="calls", reasoning=reasoning)
    return None


def request(rng: random.Random, i: int) -> tuple[list[int], SamplingParams]:
    kind = rng.choice(["json", "json", "json or calls", "calls", None])
    reasoning = rng.choice(["open", "open", "none"])
    params: dict = dict(temperature=rng.choice([0.0, 1.0]), seed=rng.randrange(1000), max_tokens=rng.choice([3, 12, 20]),
                        logit_bias={THINK_CLOSE: rng.choice([4.0, 8.0, 30.0, -100.0])},
                        structured=spec(kind, reasoning, rng))
    if rng.random() < 0.25:
        params["min_tokens"] = 2
    if rng.random() < 0.2:
        params["stop"] = [rng.choice(["a", ","])]
    prompt = PROMPT + list(range(3000 + i, 3000 + i + rng.choice([0, 5]))) + ([THINK_OPEN] if reasoning == "open" else [])
    return prompt, SamplingParams(**params)


def drive(llm: LLM, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]]) -> dict[str, tuple]:
    engine, got, step = llm.engine, {}, 0
    assert engine is not None
    while step <= max(arrivals) or engine.has_work():
        for rid, prompt, params in arrivals.get(step, []):
            got[rid] = ([], None)
            engine.add_request(prompt, params, rid)
        for out in engine.step():
            tokens, _ = got[out.request_id]
            got[out.request_id] = (tokens + list(out.token_ids), out.finish_reason if out.finished else None)
        step += 1
        assert step < 1000
    return got


@pytest.fixture(scope="module")
def engines(qwen3_ckpt):  # noqa: ANN001, ANN201
    settings = dict(dtype="float32", page_size=4, max_running_requests=3)
    with LLM(str(qwen3_ckpt), overlap=False, **settings) as serial, LLM(str(qwen3_ckpt), overlap=True, **settings) as overlap:
        yield serial, overlap


@pytest.mark.parametrize("seed", [0, 1])
def test_staggered_structured_requests_match_the_serial_loop(engines, seed: int, monkeypatch) -> None:  # noqa: ANN001
    serial, overlap = engines
    rng = random.Random(seed)
    arrivals: dict[int, list] = {}
    for i in range(12):
        arrivals.setdefault(rng.randrange(20), []).append((f"r{i}", *request(rng, i)))
    consulted = []
    pending = OutputConstraint.pending_mask
    monkeypatch.setattr(OutputConstraint, "pending_mask", lambda self: consulted.append(p := pending(self)) or p)
    assert drive(overlap, arrivals) == drive(serial, arrivals)
    assert any(p is not None for p in consulted)  # the device picked some masks
