"""The CPU expert kernel with int8 / fp8 / int4 weights on the GPU machine's host CPU (AMX
tiles, AVX-512 VNNI/BF16): against the dequantise-first fp32 reference, odd sizes and the
real Qwen3-30B-A3B shape with 128 x 128 fp8 blocks and int4 groups of 128; gpt-oss's
biased clamped-SwiGLU experts at their shape (H = I = 2880), mxfp4 as it ships; and the
bandwidth targets of issue 15 (int8 >= 80 GB/s, fp8 >= 45 GB/s of weights at batch 1, a
layer's 8 experts per call; int4 printed without a target)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from cpu_expert_support import error_bound, kernel_for, make_expert, q_weights_rounded, rounds  # noqa: E402

from edgemoe.bench.bandwidth import quant_expert_rate, quant_pool  # noqa: E402
from edgemoe.kernels import cpu_isa  # noqa: E402
from edgemoe.kernels.activations import clamped_swiglu  # noqa: E402
from edgemoe.kernels.cpu_experts_quant import expert_mlp_q_cpu, expert_mlp_q_ref, native_weights  # noqa: E402
from edgemoe.kernels.cpu_kernel import CpuExperts  # noqa: E402
from edgemoe.kernels.expert_bias import ExpertBias  # noqa: E402
from edgemoe.quant import Fp8Block, Int4Group, Int8Channel, dequantise_expert, quantise_expert  # noqa: E402
from edgemoe.quant.mxfp4 import Mxfp4  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_isa.supported("amx"), reason="host CPU has no AMX bf16")


@pytest.mark.parametrize("fmt", [Int8Channel(), Fp8Block(32), Fp8Block(128), Int4Group(32), Int4Group(128), Mxfp4()],
                         ids=["int8", "fp8-32", "fp8-128", "int4-32", "int4-128", "mxfp4"])
@pytest.mark.parametrize("hidden,inter,n", [(67, 45, 3), (130, 33, 40), (2048, 768, 1), (2048, 768, 33)])
@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_amx_quantised_expert(fmt, path: str, hidden: int, inter: int, n: int) -> None:  # noqa: ANN001
    kernel = kernel_for("amx", path, threads=4)
    gate_up, down = make_expert(hidden, inter, seed=hidden + n)
    parts = quantise_expert(fmt, gate_up[:inter], gate_up[inter:], down)
    gu, dn = dequantise_expert(fmt, parts, hidden, inter)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).bfloat16()
    y, ref = expert_mlp_q_cpu(x, parts, fmt, kernel), expert_mlp_q_ref(x, parts, fmt)
    excess = (y - ref).abs() - error_bound(x, gu, dn, *rounds("amx", path, torch.bfloat16)[:2],
                                           w_rounded=q_weights_rounded("amx", path))
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("fmt", [Mxfp4(), Int8Channel(), Fp8Block(128)], ids=["mxfp4", "int8", "fp8-128"])
# 1 token: the GEMV; 16: AMX's blocked path converting as it goes (int8 / fp8: em_qjit.h); 33: its scratch rows
@pytest.mark.parametrize("n", [1, 16, 33])
def test_amx_gpt_oss_quantised_expert_at_its_shape(fmt, n: int) -> None:  # noqa: ANN001
    kernel = CpuExperts("amx", threads=cpu_isa.physical_cores())  # the default thresholds
    hidden = inter = 2880
    gate_up, down = make_expert(hidden, inter, seed=n)
    parts = quantise_expert(fmt, gate_up[:inter] * 4, gate_up[inter:] * 4, down)  # gate/up past the clamps
    gu, dn = dequantise_expert(fmt, parts, hidden, inter)
    g = torch.Generator().manual_seed(n)
    bias = ExpertBias(torch.randn(2 * inter, generator=g).bfloat16(), torch.randn(hidden, generator=g).bfloat16())
    act, x = clamped_swiglu(1.702, 7.0), torch.randn(n, hidden, generator=g).bfloat16()
    path = "gemm" if n >= kernel.gemm_threshold(native_weights(fmt)[0]) else "gemv"  # type: ignore[index]
    y, ref = expert_mlp_q_cpu(x, parts, fmt, kernel, act, bias), expert_mlp_q_ref(x, parts, fmt, act, bias)
    excess = (y - ref).abs() - error_bound(x, gu, dn, *rounds("amx", path, x.dtype)[:2],
                                           w_rounded=q_weights_rounded("amx", path), act=act, bias=bias)
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"
    kernel.close()


@pytest.mark.parametrize(("weights", "target"), [("int8", 80.0), ("fp8", 45.0), ("int4", None), ("mxfp4", None)])
def test_quantised_bandwidth_is_measured(weights: str, target: float | None) -> None:
    """Speed is a benchmark's to report (`edgemoe bench bw --weights int8 fp8`), never a
    timed assertion: this prints the rate against issue 15's target and checks it is a
    real measurement."""
    kernel = CpuExperts("auto")
    experts = quant_pool(weights, 2**30, 2048, 768)
    rate = quant_expert_rate(kernel, weights, experts, tokens=1, per_call=8, min_seconds=1.0)
    print(f"{weights}: {rate['gb_s']:.1f} GB/s median, {rate['best_gb_s']:.1f} best "
          f"({kernel.name}, {kernel.threads} threads; target {target or 'none yet'})")
    assert 0 < rate["gb_s"] <= rate["best_gb_s"]
