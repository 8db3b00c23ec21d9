"""CPU expert kernels with int8 / fp8 weights against the dequantise-first fp32
reference, every variant this CPU has (others skip, saying why), both paths (fp32 GEMV,
blocked bf16), odd sizes and several fp8 blocks per row and column; the routed form."""

from __future__ import annotations

import pytest
import torch
from cpu_expert_support import error_bound, kernel_for, make_expert, q_weights_rounded, rounds, routed_q_cells

from edgemoe.kernels.cpu_experts_quant import (
    expert_mlp_q_cpu,
    expert_mlp_q_ref,
    native_weights,
)
from edgemoe.kernels.moe_experts import expert_mlp
from edgemoe.quant import (
    Fp8Block,
    Int4Group,
    Int8Channel,
    dequantise_expert,
    quantise_expert,
)

VARIANTS = ["torch", "scalar", "avx2", "avx512", "amx-emu", "amx"]
# Small fp8 blocks so that tiny experts hold several blocks per row and per column, and
# gate/up halves (I = 40, 45) that do not end on a block boundary.
FORMATS = {"int8": Int8Channel(), "fp8": Fp8Block(block=32)}
CASES = [(67, 45, 3), (96, 40, 17), (130, 33, 40), (100, 70, 20)]


def quantised_expert(fmt, hidden: int, inter: int, seed: int):  # noqa: ANN001, ANN201
    gate_up, down = make_expert(hidden, inter, seed)
    # Every 7th weight tiny: e4m3 subnormals (and zeros), which the C kernel converts apart.
    gate_up.view(-1)[::7] *= 1e-5
    down.view(-1)[::7] *= 1e-5
    parts = quantise_expert(fmt, gate_up[:inter], gate_up[inter:], down)
    return parts, dequantise_expert(fmt, parts, hidden, inter)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden,inter,n", CASES)
@pytest.mark.parametrize("path", ["gemv", "gemm"])
@pytest.mark.parametrize("fmt_name", list(FORMATS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_quantised_expert(variant: str, fmt_name: str, path: str, hidden: int, inter: int, n: int,
                              x_dtype: torch.dtype) -> None:
    kernel = kernel_for(variant, path)
    fmt = FORMATS[fmt_name]
    parts, (gate_up, down) = quantised_expert(fmt, hidden, inter, seed=hidden + n)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(x_dtype)
    y = expert_mlp_q_cpu(x, parts, fmt, kernel)
    ref = expert_mlp_q_ref(x, parts, fmt)
    # The dequantised weights are exact in fp32, so the float kernel's bound applies to
    # them, with the blocked path's rounding of each weight to bf16.
    x_r, h_r, _ = rounds(variant, path, x_dtype)
    bound = error_bound(x, gate_up, down, x_r and variant != "torch", h_r and variant != "torch",
                        w_rounded=q_weights_rounded(variant, path))
    excess = (y - ref).abs() - bound
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("variant", ["torch", "avx2", "avx512"])
def test_routed_quantised_matches_reference(variant: str) -> None:
    kernel = kernel_for(variant, "gemv")
    fmt, H, I, E = FORMATS["fp8"], 64, 32, 5
    experts = [quantised_expert(fmt, H, I, seed=e) for e in range(E)]
    got, want = routed_q_cells(experts, fmt, kernel, H)[:2]
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-5)  # fp32 sums of <= 64 terms


def test_formats_without_a_native_path_run_the_reference() -> None:
    fmt = Int4Group(group=48)  # int4 runs natively in groups of a multiple of 32 (test_cpu_int4.py)
    assert native_weights(fmt) is None and native_weights(Fp8Block(block=16)) is None
    parts, (gate_up, down) = quantised_expert(fmt, 64, 32, seed=1)
    x = torch.randn(3, 64)
    assert torch.equal(expert_mlp_q_cpu(x, parts, fmt), expert_mlp(x, gate_up, down, torch.nn.functional.silu))
