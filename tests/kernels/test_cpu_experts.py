"""CPU expert kernels against the fp32 torch reference (weights upcast), every variant
this CPU has (others skip, saying why), both paths (fp32 GEMV, blocked bf16), odd
sizes; the batched and routed forms; dispatch, fallbacks and the compile cache."""

from __future__ import annotations

import logging
import os
import re
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from cpu_expert_support import U32, error_bound, kernel_for, make_expert, rounds

from edgemoe.kernels import cpu_build, cpu_isa, cpu_kernel
from edgemoe.kernels.cpu_experts import (
    ExpertJob,
    expert_mlp_cpu,
    expert_mlp_ref,
    experts_cpu,
    moe_experts_cpu,
    moe_experts_partial_cpu,
    moe_experts_partial_ref,
)
from edgemoe.kernels.cpu_kernel import CpuExperts

VARIANTS = ["torch", "scalar", "avx2", "avx512", "amx-emu", "amx"]
PATHS = ["gemv", "gemm"]
# (H, I, n): multiples of the vector widths, then odd sizes that exercise every tail.
CASES = [(32, 16, 1), (67, 45, 1), (67, 45, 3), (96, 40, 17), (130, 33, 64)]


def assert_within(y: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    excess = (y - ref).abs() - bound
    assert (excess <= 0).all(), f"error exceeds its bound by {excess.max().item():.3g} (|ref| max {ref.abs().max():.3g})"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden,inter,n", CASES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_expert(variant: str, path: str, hidden: int, inter: int, n: int, x_dtype: torch.dtype) -> None:
    kernel = kernel_for(variant, path)
    gate_up, down = make_expert(hidden, inter, seed=hidden * 100 + n)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(n)).to(x_dtype)
    y = expert_mlp_cpu(x, gate_up, down, kernel)
    assert y.dtype == torch.float32 and y.shape == (n, hidden)
    assert_within(y, expert_mlp_ref(x, gate_up, down), error_bound(x, gate_up, down, *rounds(variant, path, x_dtype)))


def _uneven_jobs(hidden: int, inter: int, tokens: int, counts: list[int]) -> tuple[list[ExpertJob], int]:
    g = torch.Generator().manual_seed(7)
    rows = torch.randperm(sum(counts) + 4, generator=g).int()  # 4 rows nobody writes
    jobs, at = [], 0
    for e, c in enumerate(counts):
        gate_up, down = make_expert(hidden, inter, seed=e)
        jobs.append(ExpertJob(gate_up, down, torch.randint(0, tokens, (c,), generator=g),
                              rows[at : at + c], torch.rand(c, generator=g) + 0.1))
        at += c
    return jobs, rows.numel()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_uneven_token_lists(variant: str, path: str) -> None:
    kernel = kernel_for(variant, path)
    hidden, inter, tokens = 67, 45, 20
    jobs, num_rows = _uneven_jobs(hidden, inter, tokens, counts=[0, 1, 3, 17, 6])
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3)).bfloat16()
    out = torch.full((num_rows, hidden), float("nan"))
    experts_cpu(x, jobs, out, kernel)
    written = torch.cat([j.out_rows.long() for j in jobs])
    assert out[[r for r in range(num_rows) if r not in set(written.tolist())]].isnan().all()
    for job in jobs:
        if job.tokens.numel() == 0:
            continue
        xt, scale = x[job.tokens], job.scale[:, None]
        ref = expert_mlp_ref(xt, job.gate_up, job.down) * scale
        # the scale multiply rounds once on each side: 2·u32·|ref|
        bound = error_bound(xt, job.gate_up, job.down, *rounds(variant, path, x.dtype)) * scale + 2 * U32 * ref.abs()
        assert_within(out[job.out_rows.long()], ref, bound)


def _routing(tokens: int, k: int, num_experts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(tokens)])
    return ids, torch.rand(tokens, k, generator=g)


def _routed_bound(x, topk_ids, topk_weights, experts, weights, rounding):  # noqa: ANN001, ANN202
    """Per-cell bound [T, K, H] for the routed experts' cells (0 elsewhere)."""
    bound = torch.zeros(*topk_ids.shape, x.shape[1])
    for e, (gate_up, down) in zip(experts, weights, strict=True):
        t, k = torch.where(topk_ids == e)
        if t.numel():
            w = topk_weights[t, k, None]
            ref = expert_mlp_ref(x[t], gate_up, down) * w
            bound[t, k] = error_bound(x[t], gate_up, down, *rounding) * w + 2 * U32 * ref.abs()
    return bound


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_moe_experts_partial_matches_reference(variant: str, path: str) -> None:
    kernel = kernel_for(variant, path)
    tokens, k, num_experts, hidden, inter = 9, 3, 6, 40, 24
    topk_ids, topk_weights = _routing(tokens, k, num_experts, seed=1)
    bank_row = torch.randperm(num_experts, generator=torch.Generator().manual_seed(2)).tolist()  # expert e at row bank_row[e]
    pairs = [make_expert(hidden, inter, seed=e) for e in range(num_experts)]
    gate_up = torch.stack([pairs[bank_row.index(r)][0] for r in range(num_experts)])
    down = torch.stack([pairs[bank_row.index(r)][1] for r in range(num_experts)])
    experts = [5, 1, 2, 4]
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(4)).bfloat16()
    contrib = torch.full((tokens, k, hidden), -7.0)  # cells of other experts must keep this
    rows = [bank_row[e] for e in experts]
    moe_experts_partial_cpu(x, topk_ids, topk_weights, experts, rows, gate_up, down, F.silu, contrib, kernel)
    ref = torch.full_like(contrib, -7.0)
    moe_experts_partial_ref(x.float(), topk_ids, topk_weights, experts, rows, gate_up.float(), down.float(), F.silu, ref)
    assert torch.equal(contrib[~torch.isin(topk_ids, torch.tensor(experts))], ref[~torch.isin(topk_ids, torch.tensor(experts))])
    bound = _routed_bound(x, topk_ids, topk_weights, experts, [pairs[e] for e in experts], rounds(variant, path, x.dtype))
    assert_within(contrib, ref, bound)


def _best_native() -> str:
    for variant in ("avx512", "avx2", "scalar"):
        if cpu_isa.supported(variant):
            return variant
    return "scalar"


def test_moe_experts_with_per_expert_weights() -> None:
    kernel = kernel_for(_best_native())
    tokens, k, hidden, inter = 5, 2, 48, 20
    topk_ids, topk_weights = _routing(tokens, k, 4, seed=5)
    pairs = [make_expert(hidden, inter, seed=10 + e) for e in range(4)]
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(6))
    contrib, ref = torch.zeros(tokens, k, hidden), torch.zeros(tokens, k, hidden)
    moe_experts_cpu(x, topk_ids, topk_weights, [3, 0, 2, 1], [pairs[e] for e in (3, 0, 2, 1)], contrib, kernel)
    moe_experts_partial_ref(x, topk_ids, topk_weights, range(4), range(4),
                            torch.stack([p[0] for p in pairs]).float(), torch.stack([p[1] for p in pairs]).float(), F.silu, ref)
    assert_within(contrib, ref, _routed_bound(x, topk_ids, topk_weights, range(4), pairs, (False, False, False)))


def test_thread_count_does_not_change_results() -> None:
    """NOTE: each output element is computed by one task in a fixed order, so results
    are bitwise independent of the thread count (and of the scheduling)."""
    variant = _best_native()
    jobs, num_rows = _uneven_jobs(96, 40, 24, counts=[5, 20, 1])
    x = torch.randn(24, 96, generator=torch.Generator().manual_seed(8))
    outs = []
    for threads in (1, 3):
        out = torch.zeros(num_rows, 96)
        experts_cpu(x, jobs, out, kernel_for(variant, "gemv", threads=threads))
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_fp32_weights_and_other_activations_take_the_reference_path() -> None:
    kernel = kernel_for(_best_native())
    topk_ids, topk_weights = _routing(4, 2, 3, seed=9)
    gate_up, down = torch.randn(3, 16, 8), torch.randn(3, 8, 8)
    x = torch.randn(4, 8)
    for act, (gu, dn) in ((F.silu, (gate_up, down)), (F.gelu, (gate_up.bfloat16(), down.bfloat16()))):
        a, b = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
        moe_experts_partial_cpu(x.to(gu.dtype), topk_ids, topk_weights, [0, 2], [0, 2], gu, dn, act, a, kernel)
        moe_experts_partial_ref(x.to(gu.dtype), topk_ids, topk_weights, [0, 2], [0, 2], gu, dn, act, b)
        assert torch.equal(a, b)


def test_bad_indices_are_refused() -> None:
    kernel = kernel_for(_best_native())
    gate_up, down = make_expert(16, 8, seed=0)
    with pytest.raises(IndexError):
        experts_cpu(torch.randn(2, 16), [ExpertJob(gate_up, down, torch.tensor([0, 2]))], torch.zeros(2, 16), kernel)
    with pytest.raises(IndexError):
        experts_cpu(torch.randn(2, 16), [ExpertJob(gate_up, down, torch.tensor([0]), torch.tensor([5]))],
                    torch.zeros(2, 16), kernel)


@pytest.fixture
def fresh_dispatch():  # noqa: ANN201
    """Forget the cached auto choice and warning before and after the test."""
    for fn in (cpu_kernel._auto_kernel, cpu_kernel._warn_no_compiler):
        fn.cache_clear()
    yield
    for fn in (cpu_kernel._auto_kernel, cpu_kernel._warn_no_compiler):
        fn.cache_clear()


def test_no_compiler_runs_torch_with_one_warning(monkeypatch, caplog, fresh_dispatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CC", "/nonexistent/cc")  # $CC is honoured alone: no compiler
    monkeypatch.delenv(cpu_kernel.KERNEL_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="edgemoe.kernels.cpu_kernel"):
        kernels = [CpuExperts(), CpuExperts()]
    assert [k.name for k in kernels] == ["torch", "torch"] and not kernels[0].native
    assert len([r for r in caplog.records if "no C compiler" in r.getMessage()]) == 1
    gate_up, down = make_expert(40, 24, seed=3)
    x = torch.randn(3, 40).bfloat16()
    assert_within(expert_mlp_cpu(x, gate_up, down, kernels[0]), expert_mlp_ref(x, gate_up, down),
                  error_bound(x, gate_up, down, *rounds("torch", "gemv", x.dtype)))


def test_auto_picks_the_fastest_supported_variant(monkeypatch, fresh_dispatch) -> None:  # noqa: ANN001
    monkeypatch.delenv(cpu_kernel.KERNEL_ENV, raising=False)
    if cpu_build.find_compiler() is None:
        pytest.skip("no C compiler")
    expected = next((v for v in cpu_isa.AUTO_ORDER if cpu_isa.supported(v)), "torch")
    name = CpuExperts().name
    # amx may still be refused by the OS (arch_prctl): then the next variant runs
    assert name == expected or (expected == "amx" and name == "avx512")


def test_the_blocked_path_threshold_is_per_format_on_amx_and_overridable(monkeypatch) -> None:  # noqa: ANN001
    """AMX's blocked path wins from 8 tokens (int8 12); other variants keep 16; a caller's
    threshold (or the environment's) applies to every format, and the host function's
    mailbox carries the call's."""
    monkeypatch.delenv("EDGEMOE_CPU_GEMM_MIN_TOKENS", raising=False)
    assert [cpu_kernel.default_gemm_min_tokens("amx", w) for w in cpu_kernel.WEIGHT_FORMATS] == [8, 12, 8, 8, 8]
    for variant in ("avx512", "amx-emu", "avx2", "scalar"):
        assert {cpu_kernel.default_gemm_min_tokens(variant, w) for w in cpu_kernel.WEIGHT_FORMATS} == {16}
    if cpu_build.find_compiler() is None:
        pytest.skip("no C compiler")
    from edgemoe.kernels.cpu_host_layer import F as FIELDS
    from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes

    gate_up, down = (torch.stack(t) for t in zip(*[make_expert(32, 16, e) for e in range(4)], strict=True))
    for given, want in ((None, 16), (5, 5)):
        kernel = CpuExperts("scalar", threads=1, gemm_min_tokens=given)
        assert kernel.gemm_threshold("fp8") == kernel.gemm_threshold("bf16") == want
        mb = HostLayerMailboxes({0: {"gate_up": gate_up, "down": down}}, ("bf16", 0), kernel, 4, 2, torch.float32)
        assert int(mb.table[0, FIELDS["gemm_min_tokens"]]) == want
        kernel.close()
    monkeypatch.setenv("EDGEMOE_CPU_GEMM_MIN_TOKENS", "3")
    assert CpuExperts("scalar", threads=1).gemm_threshold("int8") == 3
    for bad in ("0", "x"):
        monkeypatch.setenv("EDGEMOE_CPU_GEMM_MIN_TOKENS", bad)
        with pytest.raises(ValueError, match="EDGEMOE_CPU_GEMM_MIN_TOKENS"):
            CpuExperts("scalar", threads=1)


def test_env_override_and_refusals(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(cpu_kernel.KERNEL_ENV, "torch")
    assert CpuExperts().name == "torch"
    monkeypatch.setenv(cpu_kernel.KERNEL_ENV, "fastest")
    with pytest.raises(ValueError, match="choose one of"):
        CpuExperts()
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset())
    with pytest.raises(ValueError, match="lacks"):
        CpuExperts("avx2")


def test_compile_cache_is_keyed_and_reused(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    cc = cpu_build.find_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv(cpu_build.CACHE_ENV, str(tmp_path))
    lib = cpu_build.build("scalar", cc)
    assert lib.parent == tmp_path / "kernels" and lib.exists()
    stamp = lib.stat().st_mtime_ns
    assert cpu_build.build("scalar", cc) == lib and lib.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert cpu_build.build_key(cc, "avx2") != cpu_build.build_key(cc, "scalar")
    edited = tmp_path / "src"
    edited.mkdir()
    for src in cpu_build.SOURCE_DIR.iterdir():
        (edited / src.name).write_bytes(src.read_bytes())
    (edited / "expert.c").write_text((edited / "expert.c").read_text() + "\n/* edited */\n")
    before = cpu_build.build_key(cc, "scalar")
    monkeypatch.setattr(cpu_build, "SOURCE_DIR", edited)
    assert cpu_build.build_key(cc, "scalar") != before


def test_tuning_defines_key_the_build_and_only_em_integers_pass(monkeypatch) -> None:  # noqa: ANN001
    cc = cpu_build.find_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    monkeypatch.delenv(cpu_build.DEFINES_ENV, raising=False)
    plain = cpu_build.build_key(cc, "scalar")
    monkeypatch.setenv(cpu_build.DEFINES_ENV, "EM_QPAGES=0  EM_PF_LOCALITY=2")
    assert cpu_build.tuning_defines() == ["-DEM_QPAGES=0", "-DEM_PF_LOCALITY=2"]
    assert cpu_build.build_key(cc, "scalar") != plain
    for bad in ("CLAIM=0", "EM_X=y", "EM_X=1;rm", "-O0", "EM_X"):
        monkeypatch.setenv(cpu_build.DEFINES_ENV, bad)
        with pytest.raises(ValueError, match=cpu_build.DEFINES_ENV):
            cpu_build.tuning_defines()


def test_concurrent_callers_share_one_pool() -> None:
    """Calls from several Python threads serialise on the pool (ctypes drops the GIL);
    more workers than cores; every result as from a single-threaded call."""
    from concurrent.futures import ThreadPoolExecutor

    variant = _best_native()
    jobs, num_rows = _uneven_jobs(67, 45, 20, counts=[3, 17, 1, 6])
    xs = [torch.randn(20, 67, generator=torch.Generator().manual_seed(s)) for s in range(6)]

    def run(kernel: CpuExperts, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(num_rows, 67)
        for _ in range(5):
            experts_cpu(x, jobs, out, kernel)
        return out

    expected = [run(kernel_for(variant, "gemv", threads=1), x) for x in xs]
    shared = kernel_for(variant, "gemv", threads=5)
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda x: run(shared, x), xs))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc")
def test_pool_workers_carry_their_name() -> None:
    """The C pool's workers are named (top, /proc, the benchmarks' busy-thread lists tell
    them from Python's threads): a kernel of 4 threads adds 3 "em-pool" threads."""
    from pathlib import Path

    def comm(task: Path) -> str:
        try:
            return (task / "comm").read_text().strip()
        except OSError:  # the thread ended between the listing and the read (an earlier test's pool)
            return ""

    def named() -> set[str]:
        """The ids of the live "em-pool" threads: a set, so pools that end meanwhile don't count."""
        return {t.name for t in Path(f"/proc/{os.getpid()}/task").iterdir() if comm(t) == "em-pool"}

    variant = _best_native()
    before = named()
    kernel = kernel_for(variant, "gemv", threads=4)
    jobs, num_rows = _uneven_jobs(67, 45, 4, counts=[3, 1])
    experts_cpu(torch.randn(4, 67), jobs, torch.zeros(num_rows, 67), kernel)  # the pool exists by now
    deadline = time.monotonic() + 5  # a worker names itself when it first runs
    while len(named() - before) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(named() - before) == 3
    del kernel


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread affinity")
def test_pinned_workers_own_the_last_cores(monkeypatch) -> None:  # noqa: ANN001
    """EDGEMOE_CPU_PIN=1: each worker on a free core of its own, the last cores first; =0:
    none pinned; the results are the same either way (each output element is one task's)."""
    from edgemoe.kernels import cpu_pinning

    monkeypatch.setattr(cpu_pinning, "_held", {})  # earlier tests' live pools (cached kernels) hold cores too
    cores = cpu_pinning.free_cores()
    workers = min(3, len(cores))
    variant = _best_native()
    jobs, num_rows = _uneven_jobs(67, 45, 20, counts=[3, 17, 1, 6])
    x = torch.randn(20, 67, generator=torch.Generator().manual_seed(4))
    outs = []
    for pin in ("0", "1"):
        monkeypatch.setenv("EDGEMOE_CPU_PIN", pin)
        kernel = CpuExperts(variant, threads=workers + 1, gemm_min_tokens=10**9)
        out = torch.zeros(num_rows, 67)
        experts_cpu(x, jobs, out, kernel)
        outs.append(out)
        if pin == "1":
            assert sorted(kernel.pinned.values()) == sorted(cores[-workers:])
            for tid, cpu in kernel.pinned.items():
                assert os.sched_getaffinity(tid) == {cpu}
        else:
            assert kernel.pinned == {}
        kernel.close()
    assert torch.equal(outs[0], outs[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread affinity")
def test_pinning_by_default_takes_free_cores_all_or_none(monkeypatch) -> None:  # noqa: ANN001
    """Unset EDGEMOE_CPU_PIN (auto): a pool pins every worker to a core no live pool holds,
    or none (it floats); a closed pool gives its cores back; EDGEMOE_CPU_THREADS (a host
    shared with other work) turns auto off; a bad value fails when the kernel is made."""
    from edgemoe.kernels import cpu_pinning

    monkeypatch.delenv("EDGEMOE_CPU_PIN", raising=False)
    monkeypatch.delenv("EDGEMOE_CPU_THREADS", raising=False)
    monkeypatch.setattr(cpu_pinning, "_held", {})  # as if no other pool were alive (earlier tests' are)
    free = cpu_pinning.free_cores()
    variant = _best_native()
    jobs, num_rows = _uneven_jobs(67, 45, 2, counts=[1, 1])

    def started(workers: int) -> CpuExperts:
        kernel = CpuExperts(variant, threads=workers + 1, gemm_min_tokens=10**9)
        experts_cpu(torch.randn(2, 67), jobs, torch.zeros(num_rows, 67), kernel)
        return kernel

    first_n = max(1, len(free) // 2)
    first = started(first_n)
    assert sorted(first.pinned.values()) == free[-first_n:]
    too_many = started(len(free) - first_n + 1)  # one worker more than the cores left
    assert too_many.pinned == {}
    rest = started(len(free) - first_n) if len(free) > first_n else None
    if rest is not None:
        assert sorted(rest.pinned.values()) == free[:len(free) - first_n]
        rest.close()
    first.close()
    again = started(first_n)
    assert sorted(again.pinned.values()) == free[-first_n:]  # the closed pool's cores, held again
    again.close()
    too_many.close()

    monkeypatch.setenv("EDGEMOE_CPU_THREADS", "2")
    shared_host = started(1)
    assert shared_host.pinned == {}
    shared_host.close()
    monkeypatch.setenv("EDGEMOE_CPU_PIN", "yes")
    with pytest.raises(ValueError, match="EDGEMOE_CPU_PIN"):
        CpuExperts(variant, threads=2)


def test_core_cpus_skips_smt_siblings(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """One CPU per (package, core) pair, in CPU order; a CPU without topology counts as a
    core (a sysfs tree written under tmp_path: CPUs 0/2 and 1/3 are siblings, 5 has none)."""
    from pathlib import Path

    for cpu, core in ((0, 0), (1, 1), (2, 0), (3, 1), (4, 2)):
        topo = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(cpu_isa, "Path", lambda p: Path(str(tmp_path) + str(p)))
    assert cpu_isa.core_cpus({0, 1, 2, 3, 4, 5}) == [0, 1, 4, 5]
    assert cpu_isa.core_cpus({2, 3}) == [2, 3]


@pytest.mark.parametrize("variant", sorted(cpu_build.VARIANT_CFLAGS))
@pytest.mark.parametrize("defines", ["", "EM_PHASE_TIMES=1 EM_TEST_HOOKS=1"])
def test_every_variant_compiles_here_whether_or_not_this_cpu_runs_it(variant: str, defines: str) -> None:
    """A variant this CPU can't run (AMX on the CI's machines) must still compile: an error
    in it would otherwise surface only on the GPU machine, where the kernel falls back to
    the next variant quietly. Only a compiler that doesn't know the variant's flags skips."""
    cc = cpu_build.find_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    try:
        assert cpu_build.build(variant, cc, defines).exists()
    except cpu_build.BuildError as e:
        if re.search(r"unrecognized (command[- ]line )?option|unknown argument|unsupported option", str(e)):
            pytest.skip(f"{cc} lacks {variant}'s flags")
        raise


def test_measurements_refuse_a_fallback_variant(monkeypatch, caplog) -> None:  # noqa: ANN001
    """`auto` falls back to the next variant when the best one this CPU runs fails to build
    (a warning says why); `best_variant_strictly`, which the measurement scripts use, refuses."""
    from edgemoe.kernels import cpu_kernel

    def load(variant: str):  # noqa: ANN202
        if variant == "amx":
            raise cpu_build.BuildError("cc failed on the amx kernel: a tile number must be constant")
        return object()

    monkeypatch.setattr(cpu_isa, "supported", lambda v, flags=None: v in ("amx", "avx512", "avx2"))
    monkeypatch.setattr(cpu_build, "find_compiler", lambda: "cc")
    monkeypatch.setattr(cpu_build, "load", load)
    cpu_kernel._auto_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cpu_kernel.log.name):
            assert cpu_kernel.resolve_kernel("auto") == "avx512"
        assert any("amx unavailable" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
        with pytest.raises(RuntimeError, match="amx kernel but it did not load"):
            cpu_kernel.best_variant_strictly()
        monkeypatch.setattr(cpu_build, "load", lambda variant: object())
        cpu_kernel._auto_kernel.cache_clear()
        assert cpu_kernel.best_variant_strictly() == "amx"
    finally:
        cpu_kernel._auto_kernel.cache_clear()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread affinity")
def test_a_pool_collected_while_another_pins_gives_its_cores_back(monkeypatch) -> None:  # noqa: ANN001
    """The collector may run a dropped pool's `__del__` (which releases its cores) inside
    `pin_workers`, on the pinning thread: that must not wait on itself, and the core it
    gives back is free to the pin under way. The release runs here from inside pinning's
    read of the cores, in a daemon thread given 10 s (the CPU suite hung on this, 2026-12-05)."""
    import threading

    from edgemoe.kernels import cpu_isa, cpu_pinning

    monkeypatch.setattr(cpu_pinning, "_held", {})
    last = cpu_pinning.free_cores()[-1]
    cpu_pinning._held[last] = os.getpid()  # a dropped pool's worker holds the last core
    real = cpu_isa.core_cpus

    def core_cpus_collecting(allowed):  # noqa: ANN001, ANN202
        cpu_pinning.release({0: last})  # as the collector would, mid-pin
        return real(allowed)

    monkeypatch.setattr(cpu_isa, "core_cpus", core_cpus_collecting)
    placed: dict[int, int] = {}
    pinner = threading.Thread(target=lambda: placed.update(cpu_pinning.pin_workers({threading.get_native_id()})),
                              daemon=True)
    pinner.start()
    pinner.join(10)
    assert not pinner.is_alive(), "pin_workers waited on its own lock"
    assert list(placed.values()) == [last]  # the released core, taken at once (last cores first)
