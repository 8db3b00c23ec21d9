"""Streamed prefill (moe/prefill_stream.py) on the GPU: copies on a copy stream one layer
ahead of compute, ordered by events only.

- executor level: streamed chunks back to back (each lends the slots again and overwrites
  both buffers), between planned steps, give bitwise the resident executor's outputs (the
  same kernels on the same weights: only slot numbers differ); a copy racing its buffer's
  reader would show here, the compute being long enough to overlap;
- engine level: greedy tokens of a small model with chunks streamed equal those with
  streaming off (the tokens of a 300-token prompt prefilled in 128-token chunks).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe import LLM, SamplingParams
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.registry import make_executor
from edgemoe.testing.moe_material import random_bank_store

CUDA = torch.device("cuda")
L, E, K, H, I = 6, 16, 4, 1024, 512


def test_streamed_chunks_back_to_back_match_resident() -> None:
    store = random_bank_store(L, E, H, I, torch.bfloat16, pinned=True)
    dev = make_executor("offload", store, CUDA, F.silu, L, 2 * E + 6, max_tokens=2048, expert_cache="device",
                        stream_tokens=256)
    resident = make_executor("resident", store, CUDA, F.silu, L, 0, max_tokens=2048)
    assert isinstance(dev, DeviceOffloadExecutor) and dev.streaming.min_tokens == 256
    g = torch.Generator(device=CUDA).manual_seed(1)
    streamed = 0
    for T in (3, 2048, 1024, 1, 300, 2000, 2):
        x = torch.randn(T, H, device=CUDA, generator=g, dtype=torch.bfloat16)
        ids = torch.randint(0, E, (T, K), device=CUDA, generator=g, dtype=torch.int32)
        w = torch.softmax(torch.randn(T, K, device=CUDA, generator=g), -1)
        for layer in range(L):
            got = dev.forward(layer, x, ids, w)
            streamed += dev.streaming.active
            want = resident.forward(layer, x, ids, w)
            assert torch.equal(got, want), (T, layer)
    assert streamed == 4 * (L - 1)  # four chunks streamed; the flag drops at each chunk's last layer
    snap = dev.stats.snapshot()
    assert snap["misses"] > 0 and snap["bytes_copied"] == snap["misses"] * store.expert_nbytes


@pytest.mark.parametrize("graphs", [True, False])
def test_streamed_prefill_gives_the_same_greedy_tokens(small_ckpt, monkeypatch, graphs: bool) -> None:  # noqa: ANN001
    prompts = [list(range(1000, 1300)), list(range(3000, 3150))]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for threshold in ("0", "64"):
        monkeypatch.setenv("EDGEMOE_PREFILL_STREAM_TOKENS", threshold)
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=40,
                 expert_cache="device", max_prefill_tokens=128, no_cuda_graph=not graphs) as llm:
            assert llm.engine.runtime.executor.streaming.min_tokens == int(threshold)
            tokens[threshold] = [o.token_ids for o in llm.generate(prompts, greedy)]
            misses = llm.stats()["moe"]["misses"]
        assert misses > 0
    assert tokens["64"] == tokens["0"]
