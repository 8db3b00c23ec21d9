"""Gated RMSNorm against transformers' `Qwen3NextRMSNormGated` and `Qwen3_5MoeRMSNormGated`."""

from __future__ import annotations

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
