"""CPU expert kernels with mxfp4 weights (`kernels/cpu/em_int4.h`: E2M1 nibbles, an E8M0
exponent per 32 k) against the dequantise-first fp32 reference: every variant this CPU has
(others skip, saying why), both paths (fp32 GEMV, blocked bf16), one token and several,
odd sizes whose last block is partial, exponents far from 127 (powers of two from 2^-126
to 2^20), every E2M1 code and -0; the routed form; what the dispatch and the C entry point
refuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cpu_expert_support import assert_q_expert_within_bound, assert_routed_q_within_bound, kernel_for, make_expert

from edgemoe.kernels import cpu_isa
from edgemoe.kernels.cpu_experts_quant import native_weights
from edgemoe.kernels.cpu_kernel import JOB_FIELDS
from edgemoe.quant import Parts, dequantise_expert, quantise_expert
from edgemoe.quant.mxfp4 import Mxfp4

VARIANTS = ["scalar", "avx2", "avx512", "amx-emu", "amx"]
# (H, I, tokens, activations): K not a multiple of 32 (a partial last block, odd K: a
# half-used last byte), 1 token and several (the GEMV's token blocks and remainders; the
# blocked path's 32-token tiles).
CASES = [
    (67, 45, 1, torch.float32),
    (96, 40, 7, torch.bfloat16),
    (130, 33, 3, torch.float32),
    (100, 70, 20, torch.bfloat16),
]


def mxfp4_expert(hidden: int, inter: int, seed: int) -> tuple[Parts, tuple[torch.Tensor, torch.Tensor]]:
    """An mxfp4 expert whose codes are random (every E2M1 value, -0 included) and whose
    exponents spread over 2^-126 .. 2^20 in some blocks, and its dequantised fp32 (gate_up, down)."""
    gate_up, down = make_expert(hidden, inter, seed)
    parts = quantise_expert(Mxfp4(), gate_up[:inter], gate_up[inter:], down)
    g = torch.Generator().manual_seed(seed)
    for name in ("gate_up", "down"):
        parts[name] = torch.randint(0, 256, parts[name].shape, generator=g, dtype=torch.uint8)
        scale = parts[f"{name}_scale"]
        far = torch.rand(scale.shape, generator=g) < 0.2  # a fifth of the blocks far from the weights' scale
        picks = torch.tensor([1, 60, 100, 147], dtype=torch.uint8)[torch.randint(0, 4, scale.shape, generator=g)]
        parts[f"{name}_scale"] = torch.where(far, picks, scale)
    return parts, dequantise_expert(Mxfp4(), parts, hidden, inter)


@pytest.mark.parametrize("hidden,inter,n,x_dtype", CASES)
@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_mxfp4_expert(variant: str, path: str, hidden: int, inter: int, n: int, x_dtype: torch.dtype) -> None:
    parts, (gate_up, down) = mxfp4_expert(hidden, inter, seed=hidden + n)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(x_dtype)
    # The GEMV's weights are the reference's fp32 values exactly (an E2M1 value times a
    # power of two), and the blocked path's unscaled E2M1 values are exact in bf16 (the
    # block's power of two applied to its partial sum).
    assert_q_expert_within_bound(kernel_for(variant, path), variant, path, x, parts, Mxfp4(), gate_up, down)


@pytest.mark.parametrize("variant,path", [("scalar", "gemv"), ("avx2", "gemv"), ("avx512", "gemv"),
                                          ("avx512", "gemm")])
def test_routed_mxfp4_matches_reference(variant: str, path: str) -> None:
    experts = [mxfp4_expert(64, 40, seed=e) for e in range(5)]
    assert_routed_q_within_bound(experts, Mxfp4(), kernel_for(variant, path), variant, path, 64)


def test_mxfp4_dispatch_and_the_kernels_block_rule() -> None:
    assert native_weights(Mxfp4()) == ("mxfp4", 32)
    kernel = kernel_for("avx512" if cpu_isa.supported("avx512") else "scalar", "gemv")
    x = torch.randn(2, 64)
    table = np.zeros((1, JOB_FIELDS), dtype=np.int64)
    with pytest.raises(ValueError, match="rejected"):  # em_experts: mxfp4 blocks are 32
        kernel.call(x, table, torch.empty(2, 64), 64, 32, "mxfp4", 64)
