"""RMSNorm and residual-add + RMSNorm: references against transformers' norms; the Triton kernel (interpreter on CPU) against the references."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.norm_fused import add_rms_norm_ref, rms_norm_ref

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def inputs(dtype: torch.dtype, shape: tuple[int, ...] = (5, 96), seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    residual = torch.randn(shape, generator=g).to(dtype)
    weight = (torch.randn(shape[-1], generator=g) * 0.3 + 1).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", DTYPES)
def test_ref_matches_qwen3_moe_norm(dtype: torch.dtype) -> None:
    mod = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
    x, residual, weight = inputs(dtype)
    norm = mod.Qwen3MoeRMSNorm(96, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        assert torch.equal(rms_norm_ref(x, weight, 1e-6), norm(x))
        normed, new_residual = add_rms_norm_ref(x, residual, weight, 1e-6)
        assert torch.equal(new_residual, residual + x)
        assert torch.equal(normed, norm(residual + x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_offset_ref_matches_qwen3_next_norm(dtype: torch.dtype) -> None:
    # weight_offset=1 is the x * (1 + w) norm of Qwen3-Next / Qwen3.5 (zero-initialised w).
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    x, _, weight = inputs(dtype)
    norm = mod.Qwen3NextRMSNorm(96, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight - 1)
        want = norm(x)
    assert torch.equal(rms_norm_ref(x, (weight - 1).to(dtype), 1e-6, weight_offset=1.0), want)


def norm_tolerance(want: torch.Tensor) -> torch.Tensor:
    """The kernel's fp32 sum of squares differs from torch's in its last bits, which can
    move a rounded output by one ulp of the dtype (bf16 2^-7, fp16 2^-10 relative);
    in fp32 a few ulps (~1e-6 relative)."""
    rel = {torch.float32: 1e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}[want.dtype]
    return rel * want.float().abs() + 1e-30


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(5, 96), (3, 4, 64)])  # hidden rows; per-head (q/k norm) rows
def test_triton_add_rms_norm(dtype: torch.dtype, offset: float, shape: tuple[int, ...]) -> None:
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton

    x, residual, weight = inputs(dtype, shape, seed=1)
    want_normed, want_residual = add_rms_norm_ref(x, residual, weight, 1e-6, offset)
    normed, new_residual = rms_norm_triton(x, residual, weight, 1e-6, offset)
    assert torch.equal(new_residual, want_residual)  # the residual add is exact torch semantics
    assert ((normed.float() - want_normed.float()).abs() <= norm_tolerance(want_normed)).all()
    plain, none = rms_norm_triton(x, None, weight, 1e-6, offset)
    assert none is None
    assert ((plain.float() - rms_norm_ref(x, weight, 1e-6, offset).float()).abs()
            <= norm_tolerance(rms_norm_ref(x, weight, 1e-6, offset))).all()
