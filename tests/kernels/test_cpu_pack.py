"""The blocked path's pack phase split by pair ranges for all a job's tokens (the default,
EM_PACK_PAIRS=64: no cache line written by two threads) against one token a task
(EM_PACK_PAIRS=0, the old split): bit for bit, over calls of several experts with token
counts that pad (np > n), odd hidden and intermediate sizes (a half pair, h pairs past
I/2), bf16 and fp32 activations, bf16 and quantised weights, and more threads than tasks."""

from __future__ import annotations

import pytest
import torch
from cpu_expert_support import kernel_for, make_expert

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_experts import ExpertJob, experts_cpu
from edgemoe.kernels.cpu_experts_quant import expert_mlp_q_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.quant import Fp8Block, quantise_expert

FP8 = Fp8Block(block=32)


@pytest.mark.parametrize("threads", [2, 5])
@pytest.mark.parametrize(("hidden", "inter"), [(64, 96), (67, 45), (300, 130)])
def test_pair_range_packing_matches_one_token_a_task_bitwise(threads: int, hidden: int, inter: int) -> None:
    variant = next((v for v in ("amx", "avx512", "amx-emu") if cpu_isa.supported(v)), None)
    if variant is None:
        pytest.skip("no variant with a blocked path on this CPU")
    kernel_for(variant, "gemm", threads=threads)  # skips without a compiler
    kernels = [CpuExperts(variant, threads=threads, gemm_min_tokens=1, lib=cpu_build.load_tuned(variant, d))
               for d in ("", "EM_PACK_PAIRS=0", "EM_PACK_PAIRS=16")]
    g = torch.Generator().manual_seed(hidden * threads)
    gate_up, down = make_expert(hidden, inter, seed=7)
    parts = quantise_expert(FP8, gate_up[:inter], gate_up[inter:], down)
    for tokens in (1, 5, 16, 20):
        rows = tokens + 3
        jobs = [ExpertJob(*make_expert(hidden, inter, seed=e), torch.randint(0, rows, (tokens,), generator=g),
                          torch.arange(e * tokens, (e + 1) * tokens), torch.rand(tokens, generator=g))
                for e in range(3)]
        for x_dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(rows, hidden, generator=g).to(x_dtype)
            outs = []
            for kernel in kernels:
                out = torch.full((3 * tokens, hidden), float("nan"))
                experts_cpu(x, jobs, out, kernel)
                outs.append(out)
            assert torch.isfinite(outs[0]).all(), (tokens, x_dtype)
            for other in outs[1:]:
                assert torch.equal(outs[0], other), (tokens, x_dtype)
        x = torch.randn(tokens, hidden, generator=g).bfloat16()
        fp8 = [expert_mlp_q_cpu(x, parts, FP8, kernel) for kernel in kernels]
        assert all(torch.equal(fp8[0], other) for other in fp8[1:]), tokens
