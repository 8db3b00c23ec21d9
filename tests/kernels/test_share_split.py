"""The CPU share's device side (kernels/share_split.py): the fused Triton launch under
the interpreter on CPU tensors against the torch reference, bit for bit — the device's
routing, the heat, the CPU expert count, the mailbox's used columns and count, x's rows,
and each pair's mailbox column (the combine's map to the CPU's cells). Quotas from 0 to every miss, padding rows (-1),
ties in heat (the higher id first), several steps so heat builds up, E past one chunk. The decode
prefetch's drop of the same pick (`drop_cpu_picks`), one launch, against its reference too."""

from __future__ import annotations

import os

import pytest
import torch

from share_split_support import mailbox, state

from edgemoe.kernels.share_split import drop_cpu_picks_ref, share_begin_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

H = 40  # not a power of two: ragged row copies


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("E,T,K,quota,fraction", [
    (8, 1, 2, 1, 16), (40, 5, 4, 3, 16), (40, 3, 4, 40, 16), (16, 2, 3, 0, 16),
    (512, 2, 10, 7, 16),  # Qwen3.8-Flash-Next's 512 experts, top-10
    (40, 5, 4, 40, 10), (40, 1, 8, 2, 6), (512, 2, 10, 8, 11),  # a fraction of each layer's misses
])
def test_begin_matches_the_reference(E: int, T: int, K: int, quota: int, fraction: int) -> None:
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    g = torch.Generator().manual_seed(E * 100 + quota + fraction)
    rows = 6
    mb_ref, mb_tri = mailbox(rows, rows * K + 1, H), mailbox(rows, rows * K + 1, H)
    resident = torch.where(torch.rand(E, generator=g) < 0.3, torch.randint(0, 9, (E,), generator=g), -1).int()
    cols = rows * K + 3  # the pairs' column map: longer than a step's pairs
    ref = state(E, cols, resident, quota, fraction=fraction)
    tri = state(E, cols, resident, quota, fraction=fraction)
    for step in range(4):
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
        dead = None
        if step == 1 and T > 1:
            ids[-1] = -1  # a padding row routes nothing
        if step == 2 and T > 1:  # a padding row named by the dead rows instead: routes nothing all the same
            dead = torch.zeros(T, dtype=torch.bool)
            dead[0] = True
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        x = torch.randn(T, H, generator=g).bfloat16()
        want = share_begin_ref(ids, w, x, ref, mb_ref, dead=dead)
        got = share_begin_triton(ids, w, x, tri, mb_tri, dead=dead)
        assert torch.equal(got, want)
        if dead is not None:
            assert bool((got[0] == -1).all()) and not bool((ids[0] == -1).any())
            assert not bool((mb_ref.pairs[0, : int(mb_ref.count)] == 0).any())  # no CPU pair on the dead row
        assert torch.equal(tri.cpu_col[: T * K], ref.cpu_col[: T * K])
        col = ref.cpu_col[: T * K]
        assert int((col >= 0).sum()) == int(mb_ref.count)  # each CPU pair's column, -1 elsewhere
        for c in range(int(mb_ref.count)):
            assert int(col[mb_ref.pairs[2, c]]) == c  # the pair the mailbox names, column c
        assert torch.equal(tri.heat, ref.heat) and torch.equal(tri.cpu_count, ref.cpu_count)
        n = int(mb_ref.count)
        assert int(mb_tri.count) == n
        assert torch.equal(mb_tri.pairs[:, :n], mb_ref.pairs[:, :n])
        assert torch.equal(mb_tri.weights[:n], mb_ref.weights[:n])
        if n:
            assert torch.equal(mb_tri.x[:T], mb_ref.x[:T])
    if quota:
        assert int(ref.cpu_count) > 0


@pytest.mark.parametrize("quota,fraction", [(3, 16), (40, 16), (40, 10), (2, 10), (40, 6), (40, 1), (40, 0)])
def test_the_decode_pick_takes_the_quota_and_the_fraction_of_each_layers_misses(quota: int, fraction: int) -> None:
    """The reference's count of CPU experts a layer = decode_take(misses, quota, fraction):
    at most the quota, the fraction of this layer's misses rounded half up (10/16 of 2
    misses is 1, of 3 is 2, of 4 is 3), and they are the coldest (the higher id on a tie)."""
    from edgemoe.kernels.share_split import decode_take
    from edgemoe.kernels.share_state import FRACTION_ONE

    E, K = 32, 8
    assert decode_take(2, 40, 10) == 1 and decode_take(3, 40, 10) == 2 and decode_take(4, 40, 10) == 3
    assert decode_take(1, 40, 1) == 0 and decode_take(5, 2, FRACTION_ONE) == 2
    g = torch.Generator().manual_seed(quota * 17 + fraction)
    for misses in range(K + 1):
        resident = torch.arange(E, dtype=torch.int32)  # every expert resident ...
        ids = torch.randperm(E, generator=g)[:K].int().view(1, K)
        resident[ids[0, :misses].long()] = -1  # ... but `misses` of the routed ones
        st = state(E, K + 1, resident, quota, fraction=fraction)
        st.heat.copy_(torch.randint(0, 4, (E,), generator=g) * 1024)
        heat = st.heat.clone()
        out = share_begin_ref(ids, torch.ones(1, K), torch.zeros(1, H).bfloat16(), st, mailbox(1, K + 1, H))
        on_cpu = ids[out == -1].tolist()
        assert len(on_cpu) == decode_take(misses, quota, fraction), (misses, on_cpu)
        missed = ids[0, :misses].tolist()
        coldest = sorted(missed, key=lambda e: (int(heat[e]), -e))[:len(on_cpu)]
        assert sorted(on_cpu) == sorted(coldest)


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("E,T,K,rates,pairs", [
    (40, 80, 4, (100, 30, 400, 0), None),  # a split: the fewest-token misses to the CPU
    (40, 80, 4, (100, 30, 250, 150), None),  # ... the device's GEMMs counted: the hits' too
    (40, 70, 4, (100, 30, 400, 0), 24),  # the mailbox's pairs bind first
    (16, 100, 3, (10**6, 10**6, 1, 1), None),  # the CPU too slow: nothing
    (512, 66, 10, (50, 5, 600, 40), None),  # 512 experts, top-10
])
def test_the_prompt_rule_matches_the_reference(E: int, T: int, K: int, rates: tuple, pairs: int | None) -> None:
    from edgemoe.kernels.share_state import PROMPT
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    g = torch.Generator().manual_seed(E + T)
    cap = (pairs if pairs is not None else T * K) + 1
    mb_ref, mb_tri = mailbox(T, cap, H), mailbox(T, cap, H)
    resident = torch.where(torch.rand(E, generator=g) < 0.3, 0, -1).int()
    ref, tri = state(E, T * K, resident, 0, rates), state(E, T * K, resident, 0, rates)
    probs = torch.linspace(3.0, 0.2, E)  # skewed: experts with many tokens and with few
    ids = torch.stack([torch.multinomial(probs, K, generator=g) for _ in range(T)]).int()
    ids[-2:] = -1  # padding rows
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    x = torch.randn(T, H, generator=g).bfloat16()
    want = share_begin_ref(ids, w, x, ref, mb_ref, PROMPT)
    got = share_begin_triton(ids, w, x, tri, mb_tri, PROMPT)
    assert torch.equal(got, want) and torch.equal(tri.cpu_count, ref.cpu_count)
    assert torch.equal(tri.heat, ref.heat) and not tri.heat.any()  # the prompt rule heats nothing
    n = int(mb_ref.count)
    assert int(mb_tri.count) == n and n <= mb_ref.cap - 1
    assert torch.equal(mb_tri.pairs[:, :n], mb_ref.pairs[:, :n]) and torch.equal(tri.cpu_col, ref.cpu_col)
    assert [int(ref.cpu_col[mb_ref.pairs[2, c]]) for c in range(n)] == list(range(n))
    assert torch.equal(mb_tri.weights[:n], mb_ref.weights[:n]) and torch.equal(mb_tri.x[:T], mb_ref.x[:T])
    cpu = int(ref.cpu_count)
    misses = int(((torch.bincount(ids[ids >= 0].long(), minlength=E) > 0) & (resident < 0)).sum())
    if rates[0] < 10**6:
        assert 0 < cpu < misses  # a split, not all or nothing
    else:
        assert cpu == 0


def test_the_prompt_rule_balances_the_predicted_times() -> None:
    """The reference's pick, by hand: misses by tokens ascending; take while the CPU's
    sum stays within the device's time for the misses left."""
    from edgemoe.kernels.share_split import balanced_misses_ref

    E = 6
    ids = torch.tensor([[0, 1], [0, 2], [0, 3], [4, 3], [5, 0]])  # tokens: e0 4, e1 1, e2 1, e3 2, e4 1, e5 1
    resident = torch.tensor([-1, -1, -1, -1, -1, 0], dtype=torch.int32)  # e5 resident
    st = state(E, 11, resident, 0, (10, 5, 30, 0))  # CPU: 10 + 5 a token; the device: 30 a copy
    on_cpu = balanced_misses_ref(ids, st, max_pairs=10)
    # Order (fewest tokens, ties to the higher id): e4, e2, e1 (1 token each), e3 (2), e0 (4).
    # k = 1: 15 <= 4 x 30; k = 2: 30 <= 90; k = 3: 45 <= 60; k = 4: 65 > 30 -> stop.
    assert on_cpu.tolist() == [False, True, True, False, True, False]
    assert balanced_misses_ref(ids, st, max_pairs=2).tolist() == [False, False, True, False, True, False]


def test_the_prompt_rule_counts_the_devices_gemms_the_hits_too() -> None:
    """The device's time left after k CPU experts: the other misses' copies and the GEMMs
    of every routed expert the CPU didn't take, the resident ones included."""
    from edgemoe.kernels.share_split import balanced_misses_ref

    ids = torch.tensor([[0, 1], [0, 2], [0, 3], [4, 3], [5, 0]])  # as above: 6 routed, 5 missed (e5 resident)
    resident = torch.tensor([-1, -1, -1, -1, -1, 0], dtype=torch.int32)
    copies_only = state(6, 11, resident, 0, (10, 5, 20, 0))
    # k = 3: 45 > (5 - 3) x 20 -> two experts
    assert balanced_misses_ref(ids, copies_only, 10).tolist() == [False, False, True, False, True, False]
    with_gemms = state(6, 11, resident, 0, (10, 5, 20, 25))
    # k = 3: 45 <= 2 x 20 + 3 x 25; k = 4 (e3, 2 tokens): 65 <= 1 x 20 + 2 x 25; k = 5: 95 > 0 + 25
    assert balanced_misses_ref(ids, with_gemms, 10).tolist() == [False, True, True, True, True, False]


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("E,T,K", [(8, 1, 2), (40, 5, 4), (128, 64, 8), (512, 2, 10), (128, 3, 8)])
def test_the_prefetch_drop_matches_the_reference(E: int, T: int, K: int) -> None:
    from edgemoe.kernels.triton_ops.share_split import drop_picks_triton

    g = torch.Generator().manual_seed(E + T)
    scratch = torch.full((E,), 7, dtype=torch.int32)  # stale values: the launch writes every expert's
    for trial in range(6):
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
        if trial % 2 and T > 1:
            ids[-1] = -1  # a padding row routes nothing
        resident = torch.where(torch.rand(E, generator=g) < 0.4, torch.arange(E), -1).int()
        heat = torch.randint(0, 3, (E,), generator=g) * 1024  # ties: the higher id first
        quota = torch.tensor([0, 1, 3, E][trial % 4])
        fraction = torch.tensor([16, 16, 6, 11, 0, 16][trial])
        want = drop_cpu_picks_ref(ids, resident, heat, quota, fraction)
        got = drop_picks_triton(ids, resident, heat, quota, fraction, scratch)
        assert torch.equal(got, want), trial
        missed = bool(((resident[ids.clamp(min=0).long()] < 0) & (ids >= 0)).any())
        if missed and int(quota) > 0 and int(fraction) == 16:  # the pick takes a miss at least: something dropped
            assert not torch.equal(got, ids), trial


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("E,T,K,quota,fraction", [(40, 1, 4, 40, 8), (128, 1, 8, 128, 12), (40, 3, 4, 2, 16)])
def test_the_pick_counts_the_prefetched_experts_as_misses(E: int, T: int, K: int, quota: int, fraction: int) -> None:
    """With the experts the decode prefetch copied counted, the pick takes its fraction of
    the misses they and the layer's misses were: bitwise the reference, and (a fraction
    of 8/16) as many experts as the prefetch left it."""
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    g = torch.Generator().manual_seed(E + fraction)
    resident = torch.where(torch.rand(E, generator=g) < 0.3, torch.arange(E), -1).int()
    ref, tri = state(E, T * K + 3, resident, quota, fraction=fraction), state(E, T * K + 3, resident, quota,
                                                                              fraction=fraction)
    mb_ref, mb_tri = mailbox(T, T * K + 1, H), mailbox(T, T * K + 1, H)
    for step in range(4):
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
        prefetched = torch.rand(E, generator=g) < 0.5  # routed or not, resident or not: only routed ones count
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        x = torch.randn(T, H, generator=g).bfloat16()
        want = share_begin_ref(ids, w, x, ref._replace(prefetched=prefetched), mb_ref)
        got = share_begin_triton(ids, w, x, tri._replace(prefetched=prefetched), mb_tri)
        assert torch.equal(got, want) and torch.equal(tri.heat, ref.heat), step
        assert torch.equal(tri.cpu_col[: T * K], ref.cpu_col[: T * K]) and int(mb_tri.count) == int(mb_ref.count)
