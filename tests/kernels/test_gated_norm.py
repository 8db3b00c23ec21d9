"""Gated RMSNorm against transformers' `Qwen3NextRMSNormGated` and `Qwen3_5MoeRMSNormGated`."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNormGated
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

from edgemoe.kernels.gated_norm import gated_rms_norm_ref


@pytest.mark.parametrize("module", [Qwen3NextRMSNormGated, Qwen3_5MoeRMSNormGated])
@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
)
def test_gated_norm_matches_transformers(module: type, x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    d = 16
    norm = module(d, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=gen) * 0.3 + 1)
    norm = norm.to(w_dtype)
    x = (torch.randn(12, d, generator=gen) * 3).to(x_dtype)
    z = torch.randn(12, d, generator=gen).to(x_dtype)
    with torch.no_grad():
        want = norm(x, z)
    got = gated_rms_norm_ref(x, z, norm.weight.detach(), 1e-6)
    # The same torch ops in the same order and casts: bitwise equal, dtype included.
    assert got.dtype == want.dtype and torch.equal(got, want)


# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def norm_tolerance(want: torch.Tensor) -> torch.Tensor:
    """The kernel's fp32 sum of squares (and, under the interpreter, its exp: on CUDA both
    are CUDA's expf) differs from torch's in its last bits, which can move a rounded output
    by one ulp of the dtype (bf16 2^-7 relative): `test_norm_fused.py`'s bound."""
    return torch.finfo(want.dtype).eps * want.float().abs() + 1e-30


@needs_triton
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("heads", [4, 0])  # [T, H, D] with the gate a slice of a projection (as in the layer); [T, D]
def test_triton_gated_norm_matches_reference(activation: str, d: int, heads: int) -> None:
    from edgemoe.kernels.triton_ops.gated_norm import gated_rms_norm_triton

    gen = torch.Generator().manual_seed(d + heads)
    T, width = 5, max(heads, 1) * d
    shape = (T, heads, d) if heads else (T, d)
    x = (torch.randn(shape, generator=gen) * 3).to(torch.bfloat16)
    proj = torch.randn(T, 3 * width, generator=gen).to(torch.bfloat16)
    gate = proj[:, width : 2 * width].view(shape)  # strided rows: not contiguous
    weight = (torch.randn(d, generator=gen) * 0.3 + 1).to(torch.bfloat16)
    want = gated_rms_norm_ref(x, gate, weight, 1e-6, activation)
    got = gated_rms_norm_triton(x, gate, weight, 1e-6, activation)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert ((got.float() - want.float()).abs() <= norm_tolerance(want)).all()


@needs_triton
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("d", [128, 64])
def test_triton_gated_norm_cast_order_is_bitwise(activation: str, d: int) -> None:
    # Where nothing is left to the reduction order or to exp, the kernel is the reference bit
    # for bit: small integers (their sum of squares is exact in fp32, in any order) and gates
    # whose activation is exact (silu(0) = 0, sigmoid(0) = 1/2; for g ≥ 17, 1 + exp(-g) rounds
    # to 1: silu(g) = g, sigmoid(g) = 1). A missing or extra rounding then shows.
    from edgemoe.kernels.triton_ops.gated_norm import gated_rms_norm_triton

    gen = torch.Generator().manual_seed(d)
    x = torch.randint(-15, 16, (6, 2, d), generator=gen).to(torch.bfloat16)
    gates = torch.tensor([0.0, 17.0, 19.5, 23.0, 30.25], dtype=torch.bfloat16)
    gate = gates[torch.randint(0, len(gates), (6, 2, d), generator=gen)]
    weight = (torch.randn(d, generator=gen) * 0.3 + 1).to(torch.bfloat16)
    want = gated_rms_norm_ref(x, gate, weight, 1e-6, activation)
    assert torch.equal(gated_rms_norm_triton(x, gate, weight, 1e-6, activation), want)
