"""The MoE combine fused with the next layer's input RMSNorm, compiled, on the GPU:
bitwise the unfused pair of kernels (`moe_combine` then `rms_norm`) at model widths,
eager and replayed from a CUDA graph; a model's prefill logits and greedy decode tokens
bitwise the same with the fusion on and off (resident with CUDA graphs, device cache)."""

from __future__ import annotations

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.kernels.moe_experts import moe_combine_norm
from edgemoe.layers.norm import OffsetRMSNorm, RMSNorm

CUDA = torch.device("cuda")


def inputs(T: int, K: int, H: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    cells = torch.randn(T, K, H, generator=g, device=CUDA)
    residual = (torch.randn(T, H, generator=g, device=CUDA) * 2).to(dtype)
    weight = (torch.randn(H, generator=g, device=CUDA) * 0.3 + 1).to(dtype)
    return cells, residual, weight


def unfused(cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor, weight: torch.Tensor, offset: float):  # noqa: ANN201
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_triton
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton

    h = moe_combine_triton(cells, dtype, residual)
    return h, rms_norm_triton(h, None, weight, 1e-6, offset)[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("H", [2048, 4096, 7168])  # Qwen3-30B-A3B, Qwen3-235B, DeepSeek-size rows (7168: masked)
@pytest.mark.parametrize(("T", "K"), [(1, 8), (37, 8), (3, 9)])  # decode, prefill, top-8 + a shared expert
def test_fused_equals_the_unfused_kernels(dtype: torch.dtype, offset: float, H: int, T: int, K: int) -> None:
    cells, residual, weight = inputs(T, K, H, dtype, seed=H + T)
    norm = (OffsetRMSNorm if offset else RMSNorm)(weight, 1e-6)
    h, normed = moe_combine_norm(cells, dtype, residual, norm)
    want_h, want_normed = unfused(cells, dtype, residual, weight, offset)
    assert torch.equal(h, want_h)
    assert torch.equal(normed, want_normed)


def test_fused_replays_from_a_cuda_graph() -> None:
    cells, residual, weight = inputs(4, 8, 2048, torch.bfloat16, seed=1)
    norm = RMSNorm(weight, 1e-6)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile off the graph
        moe_combine_norm(cells, torch.bfloat16, residual, norm)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h, normed = moe_combine_norm(cells, torch.bfloat16, residual, norm)
    for seed in (2, 3):  # fresh inputs in the captured buffers
        new_cells, new_residual, _ = inputs(4, 8, 2048, torch.bfloat16, seed=seed)
        cells.copy_(new_cells)
        residual.copy_(new_residual)
        graph.replay()
        want_h, want_normed = unfused(cells, torch.bfloat16, residual, weight, 0.0)
        assert torch.equal(h, want_h) and torch.equal(normed, want_normed)


PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("settings", [dict(moe_backend="resident"),
                                      dict(moe_backend="offload", moe_slots=8, expert_cache="device")])
def test_model_bitwise_with_fusion_on_and_off(small_ckpt, monkeypatch, settings: dict) -> None:  # noqa: ANN001
    results = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("EDGEMOE_COMBINE_NORM", switch)
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", **settings) as llm:
            chained = sum(b.next_norm is not None for b in llm.engine.runtime.model.blocks)
            tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            logits = llm.prompt_logits(PROMPTS[0] + tokens[0])
        results[switch] = (chained, tokens, logits)
    on, off = results["1"], results["0"]
    assert on[0] > 0 and off[0] == 0
    assert on[1] == off[1]
    assert torch.equal(on[2], off[2])


@pytest.mark.parametrize("T", [1, 3, 40])
def test_combine_reads_sources_in_place_bitwise(T: int) -> None:
    """The combine reading padding rows' pairs as 0 and the CPU's from a mapped pinned
    mailbox (`kernels/cell_sources.py`), compiled: bitwise the buffer written first."""
    from edgemoe.kernels.cell_sources import CellSources, apply_sources
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_norm_triton, moe_combine_triton
    from edgemoe.moe.pinning import uva_view

    K, H, dtype = 8, 2048, torch.bfloat16
    cells, residual, weight = inputs(T, K, H, dtype, seed=T)
    dead = torch.zeros(T, dtype=torch.bool, device=CUDA)
    dead[-1] = T > 1  # a padding row (and a CPU column on it: read as 0 all the same)
    cpu_out = uva_view(torch.randn(2 * K, H).pin_memory(), CUDA)
    cpu_col = torch.full((64 * K,), -1, dtype=torch.int32, device=CUDA)
    cpu_col[torch.arange(0, min(T * K, 2 * K * 3), 3, device=CUDA)] = torch.arange(
        len(range(0, min(T * K, 2 * K * 3), 3)), dtype=torch.int32, device=CUDA)
    sources = CellSources(dead, cpu_col, cpu_out)
    want = apply_sources(cells.clone(), sources)
    assert torch.equal(moe_combine_triton(cells, dtype, residual, sources), moe_combine_triton(want, dtype, residual))
    h, normed = moe_combine_norm_triton(cells, dtype, residual, weight, 1e-6, 0.0, sources)
    want_h, want_normed = moe_combine_norm_triton(want, dtype, residual, weight, 1e-6, 0.0)
    assert torch.equal(h, want_h) and torch.equal(normed, want_normed)
