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
from cpu_expert_support import U32, error_bound, kernel_for, make_expert, rounds, routed_q_cells

from edgemoe.kernels import cpu_isa
from edgemoe.kernels.cpu_experts import expert_mlp_ref
from edgemoe.kernels.cpu_experts_quant import expert_mlp_q_cpu, expert_mlp_q_ref, native_weights
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
    kernel = kernel_for(variant, path)
    fmt = Mxfp4()
    parts, (gate_up, down) = mxfp4_expert(hidden, inter, seed=hidden + n)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(x_dtype)
    y = expert_mlp_q_cpu(x, parts, fmt, kernel)
    ref = expert_mlp_q_ref(x, parts, fmt)
    # The GEMV's weights are the reference's fp32 values exactly (an E2M1 value times a
    # power of two), and the blocked path's unscaled E2M1 values are exact in bf16 (the
    # block's power of two applied to its partial sum): only the fp32 sums' order (and,
    # blocked, x and h rounded to bf16) differ, which the float kernel's bound covers.
    bound = error_bound(x, gate_up, down, *rounds(variant, path, x_dtype)[:2])
    excess = (y - ref).abs() - bound
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("variant,path", [("scalar", "gemv"), ("avx2", "gemv"), ("avx512", "gemv"),
                                          ("avx512", "gemm")])
def test_routed_mxfp4_matches_reference(variant: str, path: str) -> None:
    kernel = kernel_for(variant, path)
    H, I, E = 64, 40, 5
    fmt = Mxfp4()
    experts = [mxfp4_expert(H, I, seed=e) for e in range(E)]
    got, want, x, ids, w, gate_up, down = routed_q_cells(experts, fmt, kernel, H, weight_floor=0.1)
    x_r, h_r = rounds(variant, path, torch.float32)[:2]
    for t, k in zip(*torch.nonzero(~want[..., 0].isnan(), as_tuple=True), strict=True):
        e, wt = int(ids[t, k]), float(w[t, k])
        ref = wt * expert_mlp_ref(x[t : t + 1], gate_up[e], down[e])[0]
        bound = wt * error_bound(x[t : t + 1], gate_up[e], down[e], x_r, h_r)[0] + U32 * ref.abs()
        assert ((got[t, k] - ref).abs() <= bound).all(), (int(t), int(k))


def test_mxfp4_dispatch_and_the_kernels_block_rule() -> None:
    assert native_weights(Mxfp4()) == ("mxfp4", 32)
    kernel = kernel_for("avx512" if cpu_isa.supported("avx512") else "scalar", "gemv")
    x = torch.randn(2, 64)
    table = np.zeros((1, JOB_FIELDS), dtype=np.int64)
    with pytest.raises(ValueError, match="rejected"):  # em_experts: mxfp4 blocks are 32
        kernel.call(x, table, torch.empty(2, 64), 64, 32, "mxfp4", 64)
