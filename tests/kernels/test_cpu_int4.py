"""CPU expert kernels with int4 weights (`kernels/cpu/em_int4.h`: nibbles unpacked in
registers, fp16 scales and zero points per group) against the dequantise-first fp32
reference: every variant this CPU has (others skip, saying why), both paths (fp32 GEMV,
blocked bf16), one token and several, odd sizes whose last group is partial, groups of
32, 64 and one per row, zero points other than the symmetric 8; the routed form; what the
dispatch and the C entry point refuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cpu_expert_support import assert_q_expert_within_bound, assert_routed_q_within_bound, kernel_for, make_expert

from edgemoe.kernels import cpu_isa
from edgemoe.kernels.cpu_experts_quant import (
    expert_mlp_q_cpu,
    expert_mlp_q_ref,
    native_weights,
)
from edgemoe.kernels.cpu_kernel import JOB_FIELDS
from edgemoe.quant import Int4Group, Parts, dequantise_expert, quantise_expert

VARIANTS = ["scalar", "avx2", "avx512", "amx-emu", "amx"]
ROW = 2**30  # a group longer than any row: one group per row (published checkpoints' group -1)
# (H, I, tokens, group, activations): H and I not multiples of the group (a partial last
# group, odd K: a half-used last byte), a group a row, 1 token and several (the GEMV's
# token blocks of 4 / 2 and their remainders; the blocked path's 32-token tiles).
CASES = [
    (67, 45, 1, 32, torch.float32),
    (96, 40, 7, 64, torch.bfloat16),
    (130, 33, 3, ROW, torch.float32),
    (100, 70, 20, 32, torch.bfloat16),
]


def int4_expert(hidden: int, inter: int, group: int, seed: int) -> tuple[Parts, tuple[torch.Tensor, torch.Tensor]]:
    """An int4 expert with random zero points in [0, 15] (AWQ/GPTQ's asymmetric case; the
    quantiser writes 8 everywhere), and its dequantised fp32 (gate_up, down)."""
    gate_up, down = make_expert(hidden, inter, seed)
    # A group past the row quantises as one group (the same parts as a group of 256 here).
    parts = quantise_expert(Int4Group(min(group, 256)), gate_up[:inter], gate_up[inter:], down)
    g = torch.Generator().manual_seed(seed)
    for name in ("gate_up_zero", "down_zero"):
        parts[name] = torch.randint(0, 16, parts[name].shape, generator=g, dtype=torch.uint8)
    return parts, dequantise_expert(Int4Group(group), parts, hidden, inter)


@pytest.mark.parametrize("hidden,inter,n,group,x_dtype", CASES)
@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_int4_expert(variant: str, path: str, hidden: int, inter: int, n: int, group: int,
                         x_dtype: torch.dtype) -> None:
    parts, (gate_up, down) = int4_expert(hidden, inter, group, seed=hidden + n)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(x_dtype)
    # The GEMV's weights are the reference's fp32 values exactly ((q - zero) exact, times
    # the scale rounded once), and the blocked path's unscaled (q - zero) are exact in bf16
    # (its group scale applied to the sum, as int8/fp8's).
    assert_q_expert_within_bound(kernel_for(variant, path), variant, path, x, parts, Int4Group(group), gate_up, down)


@pytest.mark.parametrize("variant,path", [("scalar", "gemv"), ("avx2", "gemv"), ("avx512", "gemv"),
                                          ("avx512", "gemm")])
def test_routed_int4_matches_reference(variant: str, path: str) -> None:
    experts = [int4_expert(64, 40, 32, seed=e) for e in range(5)]
    assert_routed_q_within_bound(experts, Int4Group(32), kernel_for(variant, path), variant, path, 64)


def test_int4_dispatch_and_the_kernels_group_rule() -> None:
    assert native_weights(Int4Group(128)) == ("int4", 128) and native_weights(Int4Group(ROW)) == ("int4", ROW)
    assert native_weights(Int4Group(48)) is None  # not a multiple of 32: the reference
    kernel = kernel_for("avx512" if cpu_isa.supported("avx512") else "scalar", "gemv")
    parts, (gate_up, down) = int4_expert(64, 32, 32, seed=5)
    x = torch.randn(2, 64)
    fmt = Int4Group(48)  # the same parts read as groups of 48 (G = 2 still): runs the reference
    assert torch.equal(expert_mlp_q_cpu(x, parts, fmt, kernel), expert_mlp_q_ref(x, parts, fmt))
    table = np.zeros((1, JOB_FIELDS), dtype=np.int64)
    with pytest.raises(ValueError, match="rejected"):  # em_experts refuses groups the kernel can't step through
        kernel.call(x, table, torch.empty(2, 64), 64, 32, "int4", 48)
