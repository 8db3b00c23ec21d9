"""The live hybrid controller on the GPU: device timings come from CUDA events folded in
lazily (observations arrive, nothing waits for them), the CPU's timings by wall clock,
and the split is accounted in the stats."""

from __future__ import annotations

import logging

from edgemoe import LLM, SamplingParams
from edgemoe.testing.isolation import isolated

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
# experts (1.6 GB) larger than a 2 GiB cap leaves: the plan takes the slot cache (auto)
MEDIUM = dict(
    hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
    num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512, tie_word_embeddings=True,
    max_position_embeddings=8192,
)


def test_hybrid_controller_learns_from_events(small_ckpt) -> None:  # noqa: ANN001
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="hybrid", moe_slots=8,
             expert_cache="host") as llm:  # the host cache's controller (on the device cache: a live quota)
        llm.generate([list(range(2000, 2040))], GREEDY)
        split = llm.stats()["moe"]["split"]
    assert split["layers"] > 0 and split["observations"]["device"] > 0
    assert split["copy_us_per_expert"] > 0 and split["cpu_us_per_expert"] > 0


@isolated  # measures the driver-counted device memory of a fresh process
def test_auto_decides_at_start_up_and_says_why(make_ckpt, caplog) -> None:  # noqa: ANN001
    path = make_ckpt("qwen3_moe", **MEDIUM)
    with caplog.at_level(logging.WARNING, logger="edgemoe.moe.controller"), LLM(
        str(path), dtype="bfloat16", device="cuda", gpu_memory="2GiB", expert_cache="host"  # the CPU split needs it
    ) as llm:
        assert llm.engine.runtime.plan.backend == "auto"
        llm.generate([list(range(2000, 2040))], GREEDY)
        split = llm.stats()["moe"]["split"]
    assert split["choice"] in ("offload", "hybrid") and split["reason"]
    assert any(r.getMessage().startswith("moe auto: ") and "GB/s" in r.getMessage() for r in caplog.records)
