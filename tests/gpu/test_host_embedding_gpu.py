"""`--embed-weights auto` on the GPU: with experts off the device the token embedding goes
to pinned host memory and each step gathers its rows through the mapped table, inside the
decode graphs; greedy tokens equal the device table's (the rows are the same bits), and
the plan gives the table's bytes to expert slots."""

from __future__ import annotations

import torch

from edgemoe import LLM, SamplingParams
from edgemoe.layers.embedding import HostEmbedding

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def run(path, **settings: object) -> tuple[list[list[int]], object, int]:  # noqa: ANN001
    with LLM(str(path), dtype="bfloat16", device="cuda", gpu_memory="3GiB", kv_tokens=4096, **settings) as llm:
        assert llm.engine.runner.graphs is not None
        tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        return tokens, llm.engine.runtime.model.embed, llm.engine.runtime.plan.num_slots


def test_auto_gathers_the_host_rows_in_graphs_with_the_device_tokens(small_ckpt) -> None:  # noqa: ANN001
    want, on_device, slots = run(small_ckpt, moe_backend="offload", expert_cache="device", embed_weights="device")
    got, auto, auto_slots = run(small_ckpt, moe_backend="offload", expert_cache="device")
    assert isinstance(on_device, torch.Tensor) and isinstance(auto, HostEmbedding)
    assert got == want
    assert auto_slots >= slots  # the table's bytes to the slots (here capped at every expert)


def test_resident_keeps_the_table_on_the_device(small_ckpt) -> None:  # noqa: ANN001
    _, embed, _ = run(small_ckpt, moe_backend="resident")
    assert isinstance(embed, torch.Tensor) and embed.is_cuda
