"""The CPU share's host function (`em_host_layer`, kernels/cpu/em_host.h) called directly
on a mailbox: each CPU pair's weighted cell against the fp32 torch reference within the
kernel's rounding bound, and bitwise the host path's cells (`moe_expert_cells_cpu`, the
same kernel on the same jobs), in bf16, int8, fp8 and int4; what a bad mailbox does."""

from __future__ import annotations

import time

import pytest
import torch
from cpu_expert_support import U32, error_bound, kernel_for, make_expert, rounds

from edgemoe.kernels.cpu_experts import expert_mlp_ref, moe_expert_cells_cpu
from edgemoe.kernels.cpu_experts_quant import moe_expert_cells_q_cpu, native_weights
from edgemoe.kernels.cpu_host_layer import F, HostLayerMailboxes
from edgemoe.quant import Fp8Block, Int4Group, Int8Channel, dequantise_expert, quantise_expert

E, H, I, T, K = 6, 67, 45, 5, 3  # odd H and I: every vector tail


def routing(seed: int, rows: int = T) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, H], ids [rows, K] (distinct per row), weights [rows, K]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(rows)])
    return torch.randn(rows, H, generator=g), ids, torch.rand(rows, K, generator=g) + 0.1


def cpu_pairs(ids: torch.Tensor, experts: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, expert, pair index) of the pairs routed to `experts`, in pair order."""
    flat = ids.reshape(-1)
    pairs = torch.nonzero(torch.isin(flat, torch.tensor(experts))).reshape(-1)
    return pairs // ids.shape[1], flat[pairs], pairs


def bf16_banks(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    experts = [make_expert(H, I, seed + e) for e in range(E)]
    return torch.stack([gu for gu, _ in experts]), torch.stack([d for _, d in experts])


def run(mb: HostLayerMailboxes, x, ids, w, experts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair indices, the host function's cells) for the pairs of `experts`."""
    tok, exp, pairs = cpu_pairs(ids, experts)
    mb.fill(x, tok, exp, pairs, w.reshape(-1)[pairs])
    mb.run(0)
    assert mb.status(0) == 0
    return pairs, mb.cells(pairs.numel()).clone()


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("variant,path", [("scalar", "gemv"), ("avx2", "gemv"), ("avx512", "gemm")])
def test_bf16_cells_match_the_reference_and_the_host_path(variant: str, path: str, x_dtype: torch.dtype) -> None:
    kernel = kernel_for(variant, path)
    gate_up, down = bf16_banks(seed=1)
    x, ids, w = routing(seed=2)
    x = x.to(x_dtype)
    mb = HostLayerMailboxes({0: {"gate_up": gate_up, "down": down}}, ("bf16", 0), kernel, T, K, x_dtype)
    experts = [4, 1, 2]  # any order: the function groups the pairs itself
    pairs, got = run(mb, x, ids, w, experts)
    tok, exp = pairs // K, ids.reshape(-1)[pairs]
    for i in range(pairs.numel()):
        t, e, wt = int(tok[i]), int(exp[i]), float(w.reshape(-1)[pairs[i]])
        ref = wt * expert_mlp_ref(x[t : t + 1], gate_up[e], down[e])[0]
        # The kernel's bound on y, scaled by the weight, plus the rounding of w·y in fp32.
        bound = wt * error_bound(x[t : t + 1], gate_up[e], down[e], *rounds(variant, path, x_dtype))[0]
        assert ((got[i] - ref).abs() <= bound + U32 * ref.abs()).all(), (i, e)
    cells, values = moe_expert_cells_cpu(x, ids, w, sorted(experts), [(gate_up[e], down[e]) for e in sorted(experts)],
                                         kernel)
    assert torch.equal(torch.sort(cells).values, pairs)
    assert torch.equal(values[torch.argsort(cells)], got)  # the same jobs on the same kernel: the same bits


# int4 in groups of 32: H = 67 and I = 45 end in partial groups (zero points: the mailbox's own banks)
@pytest.mark.parametrize("fmt", [Int8Channel(), Fp8Block(block=32), Int4Group(group=32)], ids=["int8", "fp8", "int4"])
def test_quantised_cells_match_the_host_path_and_the_reference(fmt) -> None:
    kernel = kernel_for("avx512", "gemv")
    experts = [quantise_expert(fmt, gu[:I], gu[I:], d) for gu, d in (make_expert(H, I, 10 + e) for e in range(E))]
    banks = {name: torch.stack([p[name] for p in experts]) for name in experts[0]}
    x, ids, w = routing(seed=3)
    mb = HostLayerMailboxes({0: banks}, native_weights(fmt), kernel, T, K, torch.float32)
    chosen = [0, 3, 5]
    pairs, got = run(mb, x, ids, w, chosen)
    cells, values = moe_expert_cells_q_cpu(x, ids, w, chosen, [experts[e] for e in chosen], fmt, kernel)
    assert torch.equal(values[torch.argsort(cells)], got)
    for i, p in enumerate(pairs.tolist()):
        t, e, wt = p // K, int(ids.reshape(-1)[p]), float(w.reshape(-1)[p])
        gate_up, down = dequantise_expert(fmt, experts[e], H, I)
        ref = wt * expert_mlp_ref(x[t : t + 1], gate_up, down)[0]
        # Dequantised weights are exact in fp32: the float kernel's GEMV bound, scaled by w.
        bound = wt * error_bound(x[t : t + 1], gate_up, down, False, False)[0]
        assert ((got[i] - ref).abs() <= bound + U32 * ref.abs()).all(), (i, e)


def test_no_pairs_writes_nothing_and_a_bad_mailbox_says_so() -> None:
    kernel = kernel_for("avx512", "gemv")
    gate_up, down = bf16_banks(seed=4)
    mb = HostLayerMailboxes({7: {"gate_up": gate_up, "down": down}}, ("bf16", 0), kernel, T, K, torch.float32)
    x, ids, w = routing(seed=5)
    mb.buffers.out.fill_(3.0)
    mb.fill(x, *(torch.zeros(0, dtype=torch.int64),) * 3, torch.zeros(0))
    mb.run(7)
    assert mb.status(7) == 0 and (mb.buffers.out == 3.0).all()
    tok, exp, pairs = cpu_pairs(ids, [1])
    mb.fill(x, tok, exp.masked_fill(exp == 1, E), pairs, w.reshape(-1)[pairs])  # expert id out of range
    mb.run(7)
    assert mb.status(7) == -1 and mb.cells(pairs.numel()).isnan().all()
    mb.buffers.count.fill_(mb.buffers.cap)  # more pairs than the mailbox holds: refused, nothing read
    mb.run(7)
    assert mb.status(7) == -1
    assert mb.table[0, F["H"]] == H and mb.table[0, F["I"]] == I and mb.table[0, F["num_experts"]] == E


def test_mailboxes_are_per_layer_over_shared_buffers() -> None:
    kernel = kernel_for("avx512", "gemv")
    layers = {layer: dict(zip(("gate_up", "down"), bf16_banks(seed=20 + layer), strict=True)) for layer in (3, 5)}
    mb = HostLayerMailboxes(layers, ("bf16", 0), kernel, T, K, torch.bfloat16)
    assert mb.address(5) - mb.address(3) == len(F) * 8
    x, ids, w = routing(seed=6)
    x = x.bfloat16()
    for layer, banks in layers.items():
        tok, exp, pairs = cpu_pairs(ids, [2])
        mb.fill(x, tok, exp, pairs, w.reshape(-1)[pairs])
        mb.run(layer)
        want = moe_expert_cells_cpu(x, ids, w, [2], [(banks["gate_up"][2], banks["down"][2])], kernel)[1]
        assert torch.equal(mb.cells(pairs.numel()), want)


def test_the_bell_thread_runs_each_rung_layer_and_publishes_done() -> None:
    """The bell (kernels/cpu_bell.py) with the host playing the device: each ring runs that
    layer's mailbox on the C thread — the same cells as a direct call — and publishes the
    layer's done value; several layers in turn, and ring values of rows that don't exist
    are answered without running anything."""
    from edgemoe.kernels.cpu_bell import LINE, CpuBell

    kernel = kernel_for("avx512" if cpu_isa_has("avx512") else "scalar", "gemv")
    banks = {layer: dict(zip(("gate_up", "down"), bf16_banks(seed=10 + layer), strict=True)) for layer in (3, 5)}
    mb = HostLayerMailboxes(banks, ("bf16", 0), kernel, T, K, torch.float32)
    bell = CpuBell(mb, None)
    try:
        for step, layer in enumerate((3, 5, 3)):
            x, ids, w = routing(seed=20 + step)
            tok, exp, pairs = cpu_pairs(ids, [1, 4])
            mb.fill(x, tok, exp, pairs, w.reshape(-1)[pairs])
            mb.cells(pairs.numel()).zero_()
            bell.ring_host(layer)
            bell.wait_host(layer)
            got = mb.cells(pairs.numel()).clone()
            mb.run(layer)  # the same mailbox called directly
            assert torch.equal(got, mb.cells(pairs.numel())) and got.abs().sum() > 0
            assert mb.status(layer) == 0
        calls, ns = mb.busy()
        assert calls.tolist() == [4, 2] and (ns > 0).all()  # rows of layers 3 and 5: bell + direct calls
        bell.words[0] = 99  # no such row: answered, nothing run
        deadline = time.monotonic() + 10
        while int(bell.words[LINE]) != 99:
            assert time.monotonic() < deadline, "the bell did not answer a ring of no row"
        assert mb.busy()[0].tolist() == [4, 2]
    finally:
        bell.close()


def cpu_isa_has(variant: str) -> bool:
    from edgemoe.kernels import cpu_isa

    return cpu_isa.supported(variant)


def _voluntary_switches(name: str) -> int:
    """The voluntary context switches of this process's thread called `name` (one)."""
    from edgemoe.kernels.cpu_pinning import named_threads, task_texts

    (tid,) = named_threads(name)
    status = task_texts("status", {tid})[tid]
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_a_quiet_bell_polls_slowly_and_still_answers() -> None:
    """`set_quiet` (em_host.h): once its spin ends, a quiet bell sleeps 500 µs a poll — at
    most one wake-up a poll, however late the scheduler brings it back — and a ring that
    comes anyway is answered, then the next after it too."""
    from edgemoe.kernels.cpu_bell import CpuBell

    kernel = kernel_for("avx512" if cpu_isa_has("avx512") else "scalar", "gemv")
    banks = {0: dict(zip(("gate_up", "down"), bf16_banks(seed=30), strict=True))}
    mb = HostLayerMailboxes(banks, ("bf16", 0), kernel, T, K, torch.float32)
    bell = CpuBell(mb, None)
    try:
        bell.set_quiet(True)
        time.sleep(0.01)  # past the 2 ms spin
        before, start = _voluntary_switches("em-bell"), time.monotonic()
        time.sleep(0.1)
        polls = _voluntary_switches("em-bell") - before
        assert polls <= (time.monotonic() - start) / 500e-6 + 2, f"{polls} wake-ups in 0.1 s: not the 500 µs polls"
        for seed in (40, 41):
            x, ids, w = routing(seed)
            tok, exp, pairs = cpu_pairs(ids, [2])
            mb.fill(x, tok, exp, pairs, w.reshape(-1)[pairs])
            bell.ring_host(0)
            bell.wait_host(0)
            got = mb.cells(pairs.numel()).clone()
            mb.run(0)
            assert torch.equal(got, mb.cells(pairs.numel())) and got.abs().sum() > 0
    finally:
        bell.close()
