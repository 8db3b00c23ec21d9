"""The kernel's EM_PHASE_JOIN=1 build (a down task waits for its own expert's gate_up
tasks, not the whole phase's: kernels/cpu/expert.c): the default build's results, bit
for bit, over calls of several experts on more threads than experts and fewer, the GEMV
path and the blocked one (multi-token experts), bf16 activations and fp32."""

from __future__ import annotations

import pytest
import torch
from cpu_expert_support import kernel_for, make_expert

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_experts import ExpertJob, experts_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts


@pytest.mark.parametrize("threads", [2, 5])
@pytest.mark.parametrize(("tokens", "gemm_min"), [(1, 10**9), (3, 10**9), (20, 16)])
def test_join_build_matches_the_default_bitwise(threads: int, tokens: int, gemm_min: int) -> None:
    variant = next(v for v in ("amx", "avx512", "avx2", "scalar") if v == "scalar" or cpu_isa.supported(v))
    plain = kernel_for(variant, threads=threads)  # skips without a compiler
    plain = CpuExperts(variant, threads=threads, gemm_min_tokens=gemm_min, lib=plain.lib)
    joined = CpuExperts(variant, threads=threads, gemm_min_tokens=gemm_min,
                        lib=cpu_build.load_tuned(variant, "EM_PHASE_JOIN=1"))
    g = torch.Generator().manual_seed(threads * 100 + tokens)
    rows = tokens + 2
    for experts in (1, 3, 7):
        jobs = [ExpertJob(*make_expert(64, 96, seed=e), torch.randint(0, rows, (tokens,), generator=g),
                          torch.arange(e * tokens, (e + 1) * tokens), torch.rand(tokens, generator=g))
                for e in range(experts)]
        for x_dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(rows, 64, generator=g).to(x_dtype)
            outs = [torch.full((experts * tokens, 64), float("nan")) for _ in range(2)]
            for out, kernel in zip(outs, (plain, joined), strict=True):
                for _ in range(3):  # repeated calls: the per-expert counts start from zero each time
                    experts_cpu(x, jobs, out, kernel)
            assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1]), (experts, x_dtype)
