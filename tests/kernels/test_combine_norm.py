"""The MoE combine with the next layer's input norm fused in (`moe_experts.moe_combine_norm`):
the kernel (Triton's interpreter on CPU) bitwise against the unfused pair of kernels, and
a tiny qwen3_moe model's logits bitwise the same with the fusion on and off, on the torch
path and with the interpreted kernels."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.kernels import moe_experts, norm_fused
from edgemoe.kernels.backend import FAST_DTYPES
from edgemoe.kernels.moe_reference import moe_combine_ref
from edgemoe.kernels.norm_fused import rms_norm_ref
from edgemoe.layers.norm import OffsetRMSNorm, RMSNorm

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
EPS = 1e-6


def inputs(T: int, K: int, H: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cells = torch.randn(T, K, H, generator=g)
    residual = (torch.randn(T, H, generator=g) * 2).to(dtype)
    weight = (torch.randn(H, generator=g) * 0.3 + 1).to(dtype)
    return cells, residual, weight


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize(("T", "K", "H"), [(3, 4, 96), (2, 1, 64)])  # 96: a masked tail; K=1: no sum
def test_fused_kernel_is_the_unfused_pair_bitwise(dtype: torch.dtype, offset: float, T: int, K: int, H: int) -> None:
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_norm_triton, moe_combine_triton
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton

    cells, residual, weight = inputs(T, K, H, dtype, seed=T * K + H)
    h, normed = moe_combine_norm_triton(cells, dtype, residual, weight, EPS, offset)
    want_h = moe_combine_triton(cells, dtype, residual)
    want_normed, _ = rms_norm_triton(want_h, None, weight, EPS, offset)
    assert torch.equal(h, want_h) and torch.equal(h, moe_combine_ref(cells, dtype, residual))
    assert torch.equal(normed, want_normed)
    # Not vacuous: the norm really ran (the reference agrees to one rounding of the dtype,
    # its fp32 sum of squares runs in another order: see test_norm_fused.py).
    ref = rms_norm_ref(h, weight, EPS, offset).float()
    rel = {torch.float32: 1e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    assert ((normed.float() - ref).abs() <= rel * ref.abs() + 1e-30).all()
    empty = moe_combine_norm_triton(cells[:0], dtype, residual[:0], weight, EPS, offset)
    assert empty[0].shape == empty[1].shape == (0, H)


@pytest.mark.parametrize("norm_cls", [RMSNorm, OffsetRMSNorm])
def test_dispatcher_falls_back_to_the_pair_on_the_torch_path(norm_cls: type[RMSNorm]) -> None:
    cells, residual, weight = inputs(3, 4, 96, torch.bfloat16, seed=5)
    norm = norm_cls(weight, EPS)
    h, normed = moe_experts.moe_combine_norm(cells, torch.bfloat16, residual, norm)  # CPU tensors: torch
    want_h = moe_experts.moe_combine(cells, torch.bfloat16, residual)
    assert torch.equal(h, want_h) and torch.equal(normed, norm(want_h))


def interpreted_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The combine and norm dispatchers take their Triton kernels on CPU tensors (the
    interpreter); everything else in the model stays on the torch path."""
    def combine_cells(t: torch.Tensor, dtype: torch.dtype | None = None) -> bool:  # fp32 cells only
        return t.dtype == torch.float32 and dtype in FAST_DTYPES

    monkeypatch.setattr(moe_experts, "use_triton", combine_cells)
    monkeypatch.setattr(norm_fused, "use_triton", lambda t, dtype=None: (dtype or t.dtype) in FAST_DTYPES)


@pytest.mark.parametrize("kernels", ["torch", pytest.param("interpreter", marks=needs_triton)])
def test_tiny_model_logits_bitwise_with_fusion_on_and_off(make_ckpt, monkeypatch, kernels: str) -> None:  # noqa: ANN001
    # Layer 1 dense (mlp_only_layers): the chain falls back around it. Prefill (every
    # position's logits) and decode (greedy continuation) both run.
    path = str(make_ckpt("qwen3_moe", mlp_only_layers=[1], num_hidden_layers=3))
    if kernels == "interpreter":
        interpreted_kernels(monkeypatch)
    fused_calls, kernel_calls = [], []
    real = moe_experts.moe_combine_norm
    monkeypatch.setattr("edgemoe.moe.executor.moe_combine_norm", lambda *a: fused_calls.append(1) or real(*a))
    if INTERPRET:  # which path the dispatcher took
        from edgemoe.kernels.triton_ops import moe_combine

        kernel = moe_combine.moe_combine_norm_triton
        monkeypatch.setattr(moe_combine, "moe_combine_norm_triton", lambda *a: kernel_calls.append(1) or kernel(*a))
    prompt, results = [5, 6, 7, 8, 9], {}
    for switch in ("1", "0"):
        monkeypatch.setenv("EDGEMOE_COMBINE_NORM", switch)
        with LLM(path, dtype="bfloat16") as llm:
            model = llm.engine.runtime.model
            chained = [b.next_norm is not None for b in model.blocks]
            out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
            results[switch] = (llm.prompt_logits(prompt + out.token_ids), out.token_ids, chained, len(fused_calls))
        fused_calls.clear()
    on, off = results["1"], results["0"]
    assert on[2] == [True, True, False] and off[2] == [False, False, False]
    assert on[3] > 0 and off[3] == 0  # layer 0 (MoE, chained) fused; layer 1 dense: unfused
    assert (len(kernel_calls) > 0) == (kernels == "interpreter")  # the fused kernel ran exactly there
    assert on[1] == off[1]
    assert torch.equal(on[0], off[0])
