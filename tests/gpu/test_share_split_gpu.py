"""The CPU share's device side compiled for the GPU (`kernels/triton_ops/share_split.py`)
against the torch reference on the CPU, bit for bit, at real shapes: a decode step's quota
pick (which heats the routed experts) and a prompt chunk's balance (one sort and prefix
sums), Qwen3-30B-A3B's 128 experts and Qwen3.8's 512, the mailbox's pairs binding or not.
The decode prefetch's drop of the same pick (`drop_cpu_picks`, one launch) likewise, captured in
a graph and replayed on new routing. The interpreter runs the same comparisons on CPU tensors
(tests/kernels/test_share_split.py); this is the compiled kernel's (its barriers and scattered stores)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from share_split_support import mailbox, state  # noqa: E402

from edgemoe.kernels.share_split import drop_cpu_picks, drop_cpu_picks_ref, share_begin_ref  # noqa: E402
from edgemoe.kernels.share_state import DECODE, PROMPT  # noqa: E402

H = 2048


def skewed_ids(E: int, T: int, K: int, g: torch.Generator) -> torch.Tensor:
    probs = torch.linspace(3.0, 0.2, E)  # experts with many tokens and with few
    ids = torch.stack([torch.multinomial(probs, K, generator=g) for _ in range(T)]).int()
    if T > 1:
        ids[-1] = -1  # a padding row
    return ids


@pytest.mark.parametrize("E,T,K,rule,quota,rates,pairs,fraction", [
    (128, 1, 8, DECODE, 2, (0, 0, 0, 0), 64 * 8, 16),
    (128, 32, 8, DECODE, 3, (0, 0, 0, 0), 64 * 8, 16),
    (128, 1, 8, DECODE, 128, (0, 0, 0, 0), 64 * 8, 10),  # 10/16 of each layer's misses (the live share)
    (128, 32, 8, DECODE, 128, (0, 0, 0, 0), 64 * 8, 7),
    (128, 512, 8, PROMPT, 0, (60_000, 2_000, 105_000, 6_000), 4096, 16),  # issue 15's 512-token fp8 prompt
    (128, 512, 8, PROMPT, 0, (60_000, 2_000, 105_000, 0), 4096, 16),  # ... the copies alone
    (128, 300, 8, PROMPT, 0, (90_000, 2_000, 210_000, 6_000), 4096, 16),  # the agent turn, bf16
    (128, 700, 8, PROMPT, 0, (10_000, 200, 210_000, 6_000), 1000, 16),  # the mailbox's pairs bind first
    (512, 300, 10, PROMPT, 0, (50_000, 1_500, 140_000, 6_000), 4096, 16),  # Qwen3.8's 512 experts, top-10
])
def test_begin_matches_the_reference(E: int, T: int, K: int, rule: int, quota: int, rates: tuple,
                                              pairs: int, fraction: int) -> None:
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    g = torch.Generator().manual_seed(E * 1000 + T)
    cap = pairs + 1
    resident = torch.where(torch.rand(E, generator=g) < 0.3, torch.randint(0, 99, (E,), generator=g), -1).int()
    ref = state(E, T * K, resident, quota, rates, fraction=fraction)
    tri = state(E, T * K, resident, quota, rates, "cuda", fraction=fraction)
    mb_ref, mb_tri = mailbox(T, cap, H), mailbox(T, cap, H, "cuda")
    for step in range(3):  # decode: heat builds up over steps
        ids = skewed_ids(E, T, K, g)
        dead = None
        if step == 1 and T > 1:  # the first row named dead instead of routed -1: the launch drops its pairs
            dead = torch.zeros(T, dtype=torch.bool)
            dead[0] = True
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        x = torch.randn(T, H, generator=g).bfloat16()
        want = share_begin_ref(ids, w, x, ref, mb_ref, rule, dead)
        got = share_begin_triton(ids.cuda(), w.cuda(), x.cuda(), tri, mb_tri, rule,
                                 None if dead is None else dead.cuda())
        assert torch.equal(got.cpu(), want)
        assert torch.equal(tri.cpu_col.cpu(), ref.cpu_col)  # each pair's mailbox column
        assert torch.equal(tri.heat.cpu(), ref.heat) and torch.equal(tri.cpu_count.cpu(), ref.cpu_count)
        n = int(mb_ref.count)
        assert int(mb_tri.count) == n and n > 0
        assert torch.equal(mb_tri.pairs[:, :n].cpu(), mb_ref.pairs[:, :n])
        assert torch.equal(mb_tri.weights[:n].cpu(), mb_ref.weights[:n])
        assert n == 0 or torch.equal(mb_tri.x[:T].cpu(), mb_ref.x[:T])  # x is written for CPU pairs only
        assert [int(ref.cpu_col[mb_ref.pairs[2, c]]) for c in range(n)] == list(range(n))  # the mailbox's pairs


@pytest.mark.parametrize("E,T,K", [(128, 1, 8), (128, 64, 8), (512, 2, 10)])
def test_the_prefetch_drop_matches_the_reference_replayed(E: int, T: int, K: int) -> None:
    g = torch.Generator().manual_seed(E + T)
    cuda = torch.device("cuda")
    ids = skewed_ids(E, T, K, g).to(cuda)
    resident = torch.full((E,), -1, dtype=torch.int32, device=cuda)
    heat = torch.zeros(E, dtype=torch.int64, device=cuda)
    quota, fraction = torch.zeros((), dtype=torch.int64, device=cuda), torch.zeros((), dtype=torch.int64, device=cuda)
    scratch = torch.zeros(E, dtype=torch.int32, device=cuda)
    drop_cpu_picks(ids, resident, heat, quota, fraction, scratch)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = drop_cpu_picks(ids, resident, heat, quota, fraction, scratch)
    for trial in range(5):
        ids.copy_(skewed_ids(E, T, K, g))
        resident.copy_(torch.where(torch.rand(E, generator=g) < 0.4, torch.arange(E), -1).int())
        heat.copy_(torch.randint(0, 3, (E,), generator=g) * 1024)  # ties: the higher id first
        quota.fill_([1, 3, E, 2, 0][trial])
        fraction.fill_([16, 16, 6, 11, 16][trial])
        graph.replay()
        want = drop_cpu_picks_ref(ids.cpu(), resident.cpu(), heat.cpu(), quota.cpu(), fraction.cpu())
        assert torch.equal(out.cpu(), want), trial


@pytest.mark.parametrize("E,K,fraction", [(128, 8, 12), (512, 10, 8)])
def test_the_pick_with_prefetched_experts_matches_the_reference(E: int, K: int, fraction: int) -> None:
    """The decode pick counting the prefetch's copies as misses (`ShareState.prefetched`)."""
    from edgemoe.kernels.triton_ops.share_split import share_begin_triton

    g = torch.Generator().manual_seed(E + K)
    resident = torch.where(torch.rand(E, generator=g) < 0.3, torch.arange(E), -1).int()
    ref = state(E, K + 3, resident, E, fraction=fraction)
    dev = state(E, K + 3, resident, E, device="cuda", fraction=fraction)
    mb_ref, mb_dev = mailbox(1, K + 1, H), mailbox(1, K + 1, H, "cuda")
    for step in range(4):
        ids = skewed_ids(E, 1, K, g)
        prefetched = torch.rand(E, generator=g) < 0.5
        w = torch.softmax(torch.randn(1, K, generator=g), -1)
        x = torch.randn(1, H, generator=g).bfloat16()
        want = share_begin_ref(ids, w, x, ref._replace(prefetched=prefetched), mb_ref)
        got = share_begin_triton(ids.cuda(), w.cuda(), x.cuda(), dev._replace(prefetched=prefetched.cuda()), mb_dev)
        assert torch.equal(got.cpu(), want) and torch.equal(dev.heat.cpu(), ref.heat), step
        assert int(mb_dev.count) == int(mb_ref.count)
