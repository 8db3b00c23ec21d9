"""The kernel's phase marks (EM_PHASE_TIMES=1 builds, kernels/cpu/em_ptimes.h, read by
scripts/cpu_phase_times.py): every thread that entered a call has its entry and, per
phase, its own tasks' end then the phase's end, in order; the results are the default
build's, bit for bit."""

from __future__ import annotations

import ctypes

import torch
from cpu_expert_support import kernel_for, make_expert

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_experts import ExpertJob, experts_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts

MARKS = 7  # entry; per phase: own tasks done, phase done


def test_marks_are_in_order_and_results_unchanged() -> None:
    variant = next(v for v in ("avx512", "avx2", "scalar") if v == "scalar" or cpu_isa.supported(v))
    plain = kernel_for(variant, threads=3)  # skips without a compiler
    lib = cpu_build.load_tuned(variant, "EM_PHASE_TIMES=1")
    timed = CpuExperts(variant, threads=3, gemm_min_tokens=10**9, lib=lib)
    assert not hasattr(plain.lib, "em_phase_times")  # the default build has no marks
    g = torch.Generator().manual_seed(1)
    jobs = [ExpertJob(*make_expert(64, 96, seed=e), torch.tensor([0, 2]), torch.tensor([2 * e, 2 * e + 1]),
                      torch.rand(2, generator=g)) for e in range(4)]
    x = torch.randn(3, 64, generator=g).bfloat16()
    outs = [torch.zeros(8, 64), torch.zeros(8, 64)]
    buf = (ctypes.c_long * (MARKS * 8))()
    for out, kernel in zip(outs, (plain, timed), strict=True):
        experts_cpu(x, jobs, out, kernel)
    assert torch.equal(outs[0], outs[1])
    for _ in range(5):
        experts_cpu(x, jobs, outs[1], timed)
        n = lib.em_phase_times(buf, 8)
        assert 1 <= n <= 3
        for t in range(n):
            marks = list(buf[t * MARKS:(t + 1) * MARKS])
            assert marks[0] >= 0 and marks == sorted(marks), marks
