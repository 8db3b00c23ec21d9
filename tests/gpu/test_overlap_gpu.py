"""Overlap scheduling on the GPU (on by default there):

- the tokens of greedy and of seeded sampling with penalties are bitwise the serial loop's
  (`--no-overlap`), decode steps replayed from CUDA graphs either way;
- an overlapped decode step launches its graph (and reads its input ids on the device)
  before the host's one wait, which is for the previous step's sampled ids.
"""

from __future__ import annotations

import json

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.bench.api_trace import SYNCS

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, repetition_penalty=1.1, frequency_penalty=0.2,
                         min_tokens=8, max_tokens=40, seed=3, ignore_eos=True)


def outputs(path, overlap: bool, params: SamplingParams) -> list[tuple[list[int], str | None]]:  # noqa: ANN001
    with LLM(str(path), dtype="bfloat16", device="cuda", moe_backend="resident", overlap=overlap) as llm:
        assert (llm.engine.overlap is not None) == overlap and llm.engine.runner.graphs is not None
        return [(o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_overlap_gives_the_serial_tokens(small_ckpt, params: SamplingParams) -> None:  # noqa: ANN001
    assert outputs(small_ckpt, True, params) == outputs(small_ckpt, False, params)


def test_an_overlapped_decode_step_launches_before_it_waits(small_ckpt) -> None:  # noqa: ANN001
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        engine = llm.engine
        assert engine.overlap is not None and engine.runner.graphs is not None  # the GPU default
        engine.add_request(PROMPTS[0], GREEDY)
        for _ in range(4):  # prefill, then warm decode steps
            engine.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function("engine.step"):
                outs = engine.step()
        torch.cuda.synchronize()
        assert [len(o.token_ids) for o in outs] == [1]  # the previous step's token
        # the step's own calls: the profiler's closing device synchronise is not the step's
        (step,) = [e for e in prof.events() if e.name == "engine.step" and e.device_type == DeviceType.CPU]
        inside = lambda e: step.time_range.start <= e.time_range.start <= step.time_range.end  # noqa: E731
        calls = sorted((e.time_range.start, e.name) for e in prof.events() if e.name.startswith(("cuda", "cu")) and inside(e))
        launches = [t for t, name in calls if name == "cudaGraphLaunch"]
        waits = [t for t, name in calls if name in SYNCS]
        summary = json.dumps([name for _, name in calls])
        assert len(launches) == 1 and len(waits) <= 1, summary
        assert all(t > launches[0] for t in waits), summary


def test_a_sleeping_wait_gives_the_same_tokens(small_ckpt, monkeypatch) -> None:  # noqa: ANN001
    """EDGEMOE_BLOCKING_WAIT=1 (the engine thread sleeps on each step's result event
    instead of spinning): the spinning wait's tokens, with and without overlap."""
    from edgemoe.engine.runner import blocking_wait

    want = {overlap: outputs(small_ckpt, overlap, GREEDY) for overlap in (True, False)}
    monkeypatch.setenv("EDGEMOE_BLOCKING_WAIT", "1")
    assert blocking_wait()
    for overlap in (True, False):
        assert outputs(small_ckpt, overlap, GREEDY) == want[overlap]
