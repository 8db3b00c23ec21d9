"""The kernel's phase marks (EM_PHASE_TIMES=1 builds, kernels/cpu/em_ptimes.h, read by
scripts/cpu_phase_times.py): every thread that entered a call has its entry and, per
phase, its own tasks' end then the phase's end, in order; the results are the default
build's, bit for bit; the quantised blocked tasks sum their conversion and tile times."""

from __future__ import annotations

import ctypes

import pytest
import torch
from cpu_expert_support import kernel_for, make_expert

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_experts import ExpertJob, experts_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts

MARKS = 9  # entry; per phase: own tasks done, phase done; the blocked tasks' conversion, tiles ns
SPANS = 7


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
            assert marks[0] >= 0 and marks[:SPANS] == sorted(marks[:SPANS]), marks
            assert marks[SPANS:] == [0, 0]  # bf16 weights on the GEMV path: no blocked task converted


def test_the_blocked_quantised_tasks_sum_their_conversion_and_tiles() -> None:
    """fp8 weights on the blocked path: every thread's conversion and tile sums are >= 0,
    and over the threads both are > 0; the same call on the GEMV path sums nothing."""
    from edgemoe.bench.bandwidth import quant_expert_call, quant_pool

    variant = next((v for v in ("avx512",) if cpu_isa.supported(v)), None)
    if variant is None:
        pytest.skip("the blocked path needs AVX-512 BF16 or AMX")
    kernel_for(variant, threads=3)  # skips without a compiler
    lib = cpu_build.load_tuned(variant, "EM_PHASE_TIMES=1")
    pool = quant_pool("fp8", 1 << 20, 256, 128)
    buf = (ctypes.c_long * (MARKS * 8))()
    for gemm_min, converts in ((1, True), (10**9, False)):
        kernel = CpuExperts(variant, threads=3, gemm_min_tokens=gemm_min, lib=lib)
        quant_expert_call(kernel, "fp8", pool, 4, 2)(0)
        n = min(lib.em_phase_times(buf, 8), 8)
        sums = [list(buf[t * MARKS + SPANS:(t + 1) * MARKS]) for t in range(n)]
        assert all(v >= 0 for s in sums for v in s)
        assert (sum(s[0] for s in sums) > 0 and sum(s[1] for s in sums) > 0) == converts, sums
        kernel.close()
