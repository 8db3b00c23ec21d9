"""The AMX blocked path's int8 / fp8 tasks converting each k-step as the tiles go
(kernels/cpu/em_qjit.h, jobs of at most 32 padded tokens) against the same kernel built
with EM_QJIT_NP=0 (the task's rows converted whole into a scratch first): bit for bit,
at odd sizes, fp8 blocks that cut rows and columns, partial row groups and both token
tiles. The amx-emu build runs it on CPUs without AMX."""

from __future__ import annotations

import pytest
import torch
from cpu_expert_support import kernel_for, make_expert

from edgemoe.kernels import cpu_build
from edgemoe.kernels.cpu_experts_quant import expert_mlp_q_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.quant import Fp8Block, Int8Channel, quantise_expert

FORMATS = {"int8": Int8Channel(), "fp8": Fp8Block(block=32)}


@pytest.mark.parametrize("variant", ["amx-emu", "amx"])
@pytest.mark.parametrize("fmt_name", list(FORMATS))
@pytest.mark.parametrize(("hidden", "inter"), [(67, 45), (160, 96), (96, 33)])
def test_converting_as_the_tiles_go_matches_the_scratch_path_bitwise(variant: str, fmt_name: str, hidden: int,
                                                                       inter: int) -> None:
    jit = kernel_for(variant, "gemm")  # skips where the variant can't run
    scratch = CpuExperts(variant, threads=2, gemm_min_tokens=1, lib=cpu_build.load_tuned(variant, "EM_QJIT_NP=0"))
    fmt = FORMATS[fmt_name]
    gate_up, down = make_expert(hidden, inter, seed=hidden + inter)
    gate_up.view(-1)[::7] *= 1e-5  # e4m3 subnormals and zeros among the weights
    parts = quantise_expert(fmt, gate_up[:inter], gate_up[inter:], down)
    g = torch.Generator().manual_seed(hidden)
    for tokens in (1, 5, 16, 17, 32):  # one token tile and two; 32 padded tokens at most
        for x_dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(tokens, hidden, generator=g).to(x_dtype)
            got, want = (expert_mlp_q_cpu(x, parts, fmt, k) for k in (jit, scratch))
            assert torch.isfinite(want).all() and torch.equal(got, want), (tokens, x_dtype)
