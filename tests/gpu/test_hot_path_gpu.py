"""The hot path's budget on the GPU: a resident decode step waits for the device at
most twice (the sampled ids, and nothing else the seams could avoid), and the new
seams keep offload bitwise equal to resident."""

from __future__ import annotations

import json

from edgemoe import LLM, SamplingParams
from edgemoe.bench.api_trace import count_api_calls

PROMPT = list(range(3000, 3040))


def test_resident_decode_step_makes_at_most_two_host_syncs(small_ckpt) -> None:  # noqa: ANN001
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        engine = llm.engine
        engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
        for _ in range(4):  # prefill, then warm decode steps (allocations, kernel selection)
            engine.step()
        counts = count_api_calls(engine.step)
        assert counts.syncs <= 2, json.dumps(counts.by_name)


def test_sampled_decode_step_is_sync_free_too(small_ckpt) -> None:  # noqa: ANN001
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, repetition_penalty=1.1,
                            frequency_penalty=0.2, max_tokens=64, ignore_eos=True, seed=3)
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        engine = llm.engine
        engine.add_request(PROMPT, params)
        for _ in range(4):
            engine.step()
        counts = count_api_calls(engine.step)
        assert counts.syncs <= 2, json.dumps(counts.by_name)
