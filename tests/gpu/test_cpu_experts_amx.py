"""The AMX CPU expert kernel on the GPU machine's host CPU (Sapphire Rapids class: AMX
bf16 tiles), which CI's CPUs lack: the same checks as tests/kernels/test_cpu_experts.py
against the fp32 reference, odd sizes and the real Qwen3-30B-A3B expert shape; gpt-oss's
biased clamped-SwiGLU experts at their real shape (tests/kernels/test_cpu_experts_bias.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from cpu_expert_support import U32, error_bound, kernel_for, make_expert, rounds  # noqa: E402

from edgemoe.kernels import cpu_isa  # noqa: E402
from edgemoe.kernels.activations import clamped_swiglu  # noqa: E402
from edgemoe.kernels.cpu_experts import (  # noqa: E402
    ExpertJob,
    expert_mlp_cpu,
    expert_mlp_ref,
    experts_cpu,
)
from edgemoe.kernels.cpu_kernel import CpuExperts  # noqa: E402
from edgemoe.kernels.expert_bias import ExpertBias  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_isa.supported("amx"), reason="host CPU has no AMX bf16")


def _check(kernel: CpuExperts, path: str, hidden: int, inter: int, n: int, x_dtype: torch.dtype) -> None:
    gate_up, down = make_expert(hidden, inter, seed=hidden + n)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(x_dtype)
    y = expert_mlp_cpu(x, gate_up, down, kernel)
    ref = expert_mlp_ref(x, gate_up, down)
    excess = (y - ref).abs() - error_bound(x, gate_up, down, *rounds("amx", path, x_dtype))
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden,inter,n", [(32, 16, 1), (67, 45, 3), (96, 40, 17), (130, 33, 64), (2048, 768, 33)])
@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_amx_one_expert(path: str, hidden: int, inter: int, n: int, x_dtype: torch.dtype) -> None:
    _check(kernel_for("amx", path, threads=4), path, hidden, inter, n, x_dtype)


def test_amx_batched_layer_at_real_shape() -> None:
    """A layer's worth of experts (H=2048, I=768) with uneven tokens, default threads."""
    kernel = kernel_for("amx", "gemm", threads=cpu_isa.physical_cores())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2048, generator=g).bfloat16()
    jobs, at = [], 0
    for e, count in enumerate([1, 7, 16, 40]):
        gate_up, down = make_expert(2048, 768, seed=e)
        jobs.append(ExpertJob(gate_up, down, torch.randint(0, 64, (count,), generator=g), torch.arange(at, at + count)))
        at += count
    out = torch.zeros(at, 2048)
    experts_cpu(x, jobs, out, kernel)
    for job in jobs:
        ref = expert_mlp_ref(x[job.tokens], job.gate_up, job.down)
        bound = error_bound(x[job.tokens], job.gate_up, job.down, *rounds("amx", "gemm", x.dtype)) + 2 * U32 * ref.abs()
        assert ((out[job.out_rows] - ref).abs() <= bound).all()


@pytest.mark.parametrize("n", [1, 8, 33])
def test_amx_gpt_oss_expert_at_its_shape(n: int) -> None:
    """gpt-oss's expert (H = I = 2880, bf16 biases, the clamped SwiGLU) at AMX's default
    threshold: 1 token on the GEMV, 8 (the threshold) and 33 (two token tiles) blocked."""
    kernel = CpuExperts("amx", threads=cpu_isa.physical_cores())
    hidden = inter = 2880
    gate_up, down = make_expert(hidden, inter, seed=n)
    gate_up = gate_up * 4  # gate/up past the clamps in some lanes
    g = torch.Generator().manual_seed(n)
    bias = ExpertBias(torch.randn(2 * inter, generator=g).bfloat16(), torch.randn(hidden, generator=g).bfloat16())
    act, x = clamped_swiglu(1.702, 7.0), torch.randn(n, hidden, generator=g).bfloat16()
    path = "gemm" if n >= kernel.gemm_threshold("bf16") else "gemv"
    y, ref = expert_mlp_cpu(x, gate_up, down, kernel, act, bias), expert_mlp_ref(x, gate_up, down, act, bias)
    bound = error_bound(x, gate_up, down, *rounds("amx", path, x.dtype)[:2], act=act, bias=bias)
    assert ((y - ref).abs() <= bound).all(), f"error exceeds its bound by {((y - ref).abs() - bound).max():.3g}"
    kernel.close()


def test_auto_dispatch_takes_amx() -> None:
    assert CpuExperts("auto").name == "amx"
