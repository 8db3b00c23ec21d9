"""Detached calls of the CPU share's host function (kernels/cpu/em_detach.h): a pool
worker held at a task (the EM_TEST_STALL build's hook, standing for a worker whose core
was taken away) must not hold the call. The call returns with the right cells — its task
run again by another thread —, later calls on other layers over the same shared buffers
stay right while the worker is held, and the worker, let go, never writes the output it
lost (its task was committed by the rescuer). The plain entry point (`em_experts`, which
must not return while a worker may still read its caller's tensors) waits for it instead.

Every cell is compared bit for bit with the same kernel's undisturbed call: a rescued task
runs the same code on the same inputs."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from cpu_expert_support import kernel_for, make_expert

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_experts import ExpertJob, experts_cpu
from edgemoe.kernels.cpu_experts_quant import native_weights
from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.quant import Fp8Block, Int4Group, Int8Channel, quantise_expert

E, H, I, T, K = 6, 67, 45, 5, 3  # odd H and I: every vector tail
HANG_S = 60.0  # a guard against a hang (the failure), not a speed bound


def best_variant() -> str:
    return next(v for v in ("amx", "avx512", "avx2", "scalar") if v == "scalar" or cpu_isa.supported(v))


def stall_kernel(gemm_min: int, threads: int = 4) -> CpuExperts:
    variant = best_variant()
    kernel_for(variant, threads=threads)  # skips without a compiler
    # workers spin 5 ms between calls (not 200 µs), so on any host they join the next call
    # and claim some of its tasks rather than sleep through it while the caller does them all
    return CpuExperts(variant, threads=threads, gemm_min_tokens=gemm_min, spin_us=5000,
                      lib=cpu_build.load_tuned(variant, "EM_TEST_STALL=1"))


def layer_banks(seed: int) -> dict[str, torch.Tensor]:
    experts = [make_expert(H, I, seed * 100 + e) for e in range(E)]
    return {"gate_up": torch.stack([gu for gu, _ in experts]), "down": torch.stack([d for _, d in experts])}


def step(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, H] and the CPU pairs of every token's K experts: (x, tokens, experts, pair index, weights)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    pairs = torch.arange(T * K)
    return (torch.randn(T, H, generator=g).to(torch.bfloat16), pairs // K, ids.reshape(-1), pairs,
            torch.rand(T * K, generator=g) + 0.1)


def call(mb: HostLayerMailboxes, layer: int, inputs) -> torch.Tensor:
    """The layer's cells for `inputs`, from a call on another thread (a hang fails, not blocks);
    the output is NaN before the call, so a row it leaves unwritten shows."""
    mb.fill(*inputs)
    mb.buffers.out.fill_(float("nan"))
    worker = threading.Thread(target=mb.run, args=(layer,), daemon=True)
    worker.start()
    worker.join(HANG_S)
    assert not worker.is_alive(), "the host function did not return while a worker was held"
    assert mb.status(layer) == 0
    return mb.cells(T * K).clone()


def attempts(limit_s: float = HANG_S / 2):  # noqa: ANN201 - a generator of nothing
    """Loop turns until `limit_s` has passed: a worker (not the caller) claims a task only
    when the scheduler runs it first, which a loaded host (CI's 2 cores beside other
    processes) may not do for hundreds of calls."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        yield


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


@pytest.mark.parametrize("gemm_min", [10**9, 2], ids=["gemv", "blocked"])
@pytest.mark.parametrize("after", [0, 1], ids=["before-the-task", "before-its-count"])
@pytest.mark.parametrize("phase", [0, 1, 2])
def test_a_held_worker_does_not_hold_the_host_function(phase: int, after: int, gemm_min: int) -> None:
    kernel = stall_kernel(gemm_min)
    lib = kernel.lib
    mb = HostLayerMailboxes({0: layer_banks(1), 1: layer_banks(2)}, ("bf16", 0), kernel, T, K, torch.bfloat16)
    a, b = step(3), step(4)
    want_a, want_b = call(mb, 0, a), call(mb, 1, b)  # undisturbed
    assert torch.isfinite(want_a).all() and not torch.equal(want_a, want_b)
    lib.em_test_stall(phase, after)
    try:
        for _ in attempts():  # until a worker (not the caller) claims a task of `phase`
            assert torch.equal(call(mb, 0, a), want_a)
            if lib.em_test_holding():
                break
        assert lib.em_test_holding(), "no worker claimed a task in 30 s of calls"
        for _ in range(3):  # the held worker's slot stays its own; other calls take others
            assert torch.equal(call(mb, 1, b), want_b)
            assert torch.equal(call(mb, 0, a), want_a)
        assert torch.equal(call(mb, 1, b), want_b)
        stats = kernel.pool_stats()
        assert stats["rescued"] >= 1 and stats["left_behind"] >= 1 and stats["slots_peak"] >= 2, stats
    finally:
        lib.em_test_release()
    wait_until(lambda: kernel.pool_stats()["inside"] == 0, "the released worker never left its call")
    assert torch.equal(mb.cells(T * K), want_b), "the released worker wrote the output it lost"
    assert torch.equal(call(mb, 0, a), want_a)
    kernel.close()


def test_the_plain_entry_point_waits_for_a_held_worker() -> None:
    """em_experts (torch tensors the caller may free) returns only once the worker left,
    with the undisturbed results."""
    kernel = stall_kernel(10**9)
    lib = kernel.lib
    g = torch.Generator().manual_seed(5)
    jobs = [ExpertJob(*make_expert(H, I, seed=e), torch.randint(0, T, (2,), generator=g),
                      torch.arange(2 * e, 2 * e + 2), torch.rand(2, generator=g)) for e in range(4)]
    x = torch.randn(T, H, generator=g)
    want = torch.full((8, H), float("nan"))
    experts_cpu(x, jobs, want, kernel)
    lib.em_test_stall(2, 1)
    got = torch.full((8, H), float("nan"))
    returned, released = threading.Event(), threading.Event()

    def run() -> None:
        for _ in attempts():
            experts_cpu(x, jobs, got, kernel)
            if released.is_set():
                break
        returned.set()

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    try:
        wait_until(lambda: lib.em_test_holding() or returned.is_set(), "no worker was held")
        held = bool(lib.em_test_holding())
        if held:  # its call cannot have returned: the worker is inside it
            assert kernel.pool_stats()["inside"] >= 1 and not returned.is_set()
    finally:
        lib.em_test_release()
        released.set()
    caller.join(HANG_S)
    assert not caller.is_alive()
    assert held, "no worker claimed a down task in 30 s of calls"
    assert kernel.pool_stats()["left_behind"] == 0 and kernel.pool_stats()["rescued"] == 0
    assert torch.equal(got, want)
    kernel.close()


@pytest.mark.parametrize("gemm_min", [10**9, 2], ids=["gemv", "blocked"])
def test_a_late_pack_does_not_clear_what_gate_up_wrote(gemm_min: int) -> None:
    """A pack task run twice (its claimant late, a rescuer first) may store after gate_up
    ran: with I odd the blocked layout's last h pair is gate_up's alone, so a pack landing
    then changes nothing (it zeroed the pair, and h[I-1] with it, before 2026-12-05 19:50).
    The test build's caller packs again between the phases, every call."""
    kernel = stall_kernel(gemm_min)
    mb = HostLayerMailboxes({0: layer_banks(1)}, ("bf16", 0), kernel, T, K, torch.bfloat16)
    a = step(5)
    want = call(mb, 0, a)
    kernel.lib.em_test_repack(1)
    try:
        for _ in range(3):
            assert torch.equal(call(mb, 0, a), want)
    finally:
        kernel.lib.em_test_repack(0)
    kernel.close()


def test_a_rescuer_held_in_turn_is_taken_over() -> None:
    """The worker that took a late task over loses its core too: after another grace period
    a third thread runs the task, and the call still returns with the undisturbed cells."""
    kernel = stall_kernel(10**9, threads=5)
    lib = kernel.lib
    mb = HostLayerMailboxes({0: layer_banks(1), 1: layer_banks(2)}, ("bf16", 0), kernel, T, K, torch.bfloat16)
    a, b = step(3), step(4)
    want_a, want_b = call(mb, 0, a), call(mb, 1, b)
    lib.em_test_caller_rescues(0)  # workers take late tasks over, so one can be held doing it
    lib.em_test_stall(2, 0)  # a worker holding a down task
    lib.em_test_stall(2, 2)  # and the first worker to take such a task over
    try:
        for _ in range(400):
            assert torch.equal(call(mb, 0, a), want_a)
            if lib.em_test_holding() == 2:
                break
        assert lib.em_test_holding() == 2, "no worker took a held task over in 400 calls"
        assert torch.equal(call(mb, 1, b), want_b)
        assert kernel.pool_stats()["rescued"] >= 1  # the take-over (the held rescuer counts when it ends)
    finally:
        lib.em_test_release()
        lib.em_test_caller_rescues(1)
    wait_until(lambda: kernel.pool_stats()["inside"] == 0, "the released workers never left")
    assert torch.equal(mb.cells(T * K), want_b)
    kernel.close()


def test_dropping_the_mailboxes_waits_for_a_late_worker() -> None:
    """A late worker may still read the mailbox's x and the banks after its call returned:
    dropping the mailboxes (their buffers freed) waits until it left (`CpuExperts.quiesce`)."""
    kernel = stall_kernel(10**9)
    lib = kernel.lib
    holder = {"mb": HostLayerMailboxes({0: layer_banks(1)}, ("bf16", 0), kernel, T, K, torch.bfloat16)}
    a = step(3)
    lib.em_test_stall(0, 0)
    try:
        for _ in attempts():
            call(holder["mb"], 0, a)
            if lib.em_test_holding():
                break
        assert lib.em_test_holding(), "no worker claimed a task in 30 s of calls"
        dropper = threading.Thread(target=holder.clear, daemon=True)
        dropper.start()
        dropper.join(0.3)
        assert dropper.is_alive() and kernel.pool_stats()["inside"] >= 1  # still waiting for the held worker
    finally:
        lib.em_test_release()
    dropper.join(HANG_S)
    assert not dropper.is_alive() and kernel.pool_stats()["inside"] == 0
    kernel.close()


# int4 in groups of 32: H = 67 and I = 45 end in partial groups
@pytest.mark.parametrize("fmt", [Int8Channel(), Fp8Block(block=32), Int4Group(group=32)], ids=["int8", "fp8", "int4"])
@pytest.mark.parametrize("gemm_min", [10**9, 2], ids=["gemv", "blocked"])
def test_quantised_experts_with_a_held_worker(fmt, gemm_min: int) -> None:  # noqa: ANN001
    """The quantised paths' down tasks cover other row counts (int8 / fp8 GEMV 32, blocked
    24 / 32, int4 16): a held down task is run again and committed over exactly its rows."""
    kernel = stall_kernel(gemm_min)
    lib = kernel.lib

    def banks(seed: int) -> dict[str, torch.Tensor]:
        experts = [quantise_expert(fmt, gu[:I], gu[I:], d) for gu, d in (make_expert(H, I, seed * 100 + e)
                                                                          for e in range(E))]
        return {name: torch.stack([q[name] for q in experts]) for name in experts[0]}

    mb = HostLayerMailboxes({0: banks(1), 1: banks(2)}, native_weights(fmt), kernel, T, K, torch.bfloat16)
    a, b = step(3), step(4)
    want_a, want_b = call(mb, 0, a), call(mb, 1, b)
    assert torch.isfinite(want_a).all() and torch.isfinite(want_b).all() and not torch.equal(want_a, want_b)
    lib.em_test_stall(2, 1)
    try:
        for _ in attempts():
            assert torch.equal(call(mb, 0, a), want_a)
            if lib.em_test_holding():
                break
        assert lib.em_test_holding(), "no worker claimed a down task in 30 s of calls"
        assert torch.equal(call(mb, 1, b), want_b)
    finally:
        lib.em_test_release()
    wait_until(lambda: kernel.pool_stats()["inside"] == 0, "the released worker never left its call")
    assert torch.equal(mb.cells(T * K), want_b)
    kernel.close()
