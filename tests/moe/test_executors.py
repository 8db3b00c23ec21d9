"""Every executor computes the same thing as the resident one, bitwise, on CPU —
at every slot-pool size, with waves, CPU splits and cache state carried across calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import network_atol

from edgemoe.layers.norm import RMSNorm
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore as ExpertStore

L, E, K, H, I = 3, 8, 2, 16, 12


@pytest.fixture(scope="module")
def store() -> ExpertStore:
    g = torch.Generator().manual_seed(0)
    s = ExpertStore.allocate(list(range(L)), E, H, I, torch.float32)
    for b in s.banks.values():
        b.gate_up.copy_(torch.randn(b.gate_up.shape, generator=g) / H**0.5)
        b.down.copy_(torch.randn(b.down.shape, generator=g) / I**0.5)
    return s


def reference(store: ExpertStore, layer: int, x, ids, w) -> torch.Tensor:  # noqa: ANN001
    """Plain per-token loop: sum_k w * down(silu(gate x) * up x)."""
    bank = store.banks[layer]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            gate, up = (bank.gate_up[ids[t, k]] @ x[t]).chunk(2)
            out[t] += w[t, k] * (bank.down[ids[t, k]] @ (F.silu(gate) * up))
    return out


def expert_atol(ref: torch.Tensor) -> float:
    """Batched GEMMs against the per-token loop: reductions over H, then I, then K."""
    return network_atol(torch.float32, max(H, I, K), ref.abs().max().item())


def routings(seed: int, steps: int = 12):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        T = [1, 1, 3, 7, 16][step % 5]
        x = torch.randn(T, H, generator=g)
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        yield x, ids, w


CONFIGS = [
    ("offload", dict(num_slots=K)),  # minimum pool: every wider layer runs in waves
    ("offload", dict(num_slots=L * E // 4)),
    ("offload", dict(num_slots=L * E)),
    ("offload", dict(num_slots=5, policy="lfu")),
    ("cpu", dict(num_slots=K)),
    ("cpu", dict(num_slots=6)),
    ("hybrid", dict(num_slots=K, hybrid_fraction=0.5)),
    ("hybrid", dict(num_slots=6, hybrid_fraction=0.3)),
    ("hybrid", dict(num_slots=6, hybrid_fraction=1.0)),
    ("hybrid", dict(num_slots=6)),  # the live controller decides each layer's split
    ("auto", dict(num_slots=K, top_k=K)),
]


@pytest.mark.parametrize("backend,kw", CONFIGS, ids=[f"{b}-{kw}" for b, kw in CONFIGS])
def test_executor_matches_resident_bitwise(store: ExpertStore, backend: str, kw: dict) -> None:
    dev = torch.device("cpu")
    resident = make_executor("resident", store, dev, F.silu, L, 0)
    other = make_executor(backend, store, dev, F.silu, L, **kw)
    distinct = 0  # expert uses: each layer's distinct routed experts, per call
    for x, ids, w in routings(seed=1):
        for layer in range(L):
            distinct += len(set(ids.flatten().tolist()))
            want = resident.forward(layer, x, ids, w)
            got = other.forward(layer, x, ids, w)
            assert torch.equal(got, want)
            ref = reference(store, layer, x, ids, w)
            torch.testing.assert_close(want, ref, rtol=0, atol=expert_atol(ref))
    snap = other.stats.snapshot()
    assert snap["hits"] + snap["misses"] == distinct
    resident_snap = resident.stats.snapshot()  # every routed pair is a resident hit
    assert resident_snap["hits"] == sum(ids.numel() for _, ids, _ in routings(seed=1)) * L
    assert resident_snap["hit_rate"] == 1.0
    if backend == "offload" and kw["num_slots"] < L * E:
        assert snap["misses"] > 0 and snap["bytes_copied"] > 0
    if backend == "cpu":
        assert snap["experts_cpu"] == snap["misses"] > 0
    other.close()


def test_routed_set_larger_than_pool_runs_in_waves(store: ExpertStore) -> None:
    dev = torch.device("cpu")
    ex = make_executor("offload", store, dev, F.silu, L, num_slots=K)
    x = torch.randn(E, H)
    ids = torch.stack([torch.arange(E).roll(t)[:K] for t in range(E)])  # every expert routed
    w = torch.full((E, K), 0.5)
    got = ex.forward(0, x, ids, w)
    ref = reference(store, 0, x, ids, w)
    torch.testing.assert_close(got, ref, rtol=0, atol=expert_atol(ref))
    assert ex.stats.misses[0] == E and ex.stats.bytes_copied == E * store.expert_nbytes
    ex.cache.check_invariants()


def test_second_pass_hits_when_everything_fits(store: ExpertStore) -> None:
    ex = make_executor("offload", store, torch.device("cpu"), F.silu, L, num_slots=L * E)
    x, ids, w = next(routings(seed=3))
    ex.forward(1, x, ids, w)
    misses = ex.stats.misses[1]
    ex.forward(1, x, ids, w)
    assert ex.stats.misses[1] == misses and ex.stats.hits[1] == len(torch.unique(ids))


def test_recover_empties_the_cache_and_stays_correct(store: ExpertStore) -> None:
    ex = make_executor("offload", store, torch.device("cpu"), F.silu, L, num_slots=6)
    resident = make_executor("resident", store, torch.device("cpu"), F.silu, L, 0)
    x, ids, w = next(routings(seed=5))
    ex.cache.plan_layer(0, [0, 1, 2])  # a layer planned but never released: an aborted step
    ex.recover()
    ex.cache.check_invariants()
    assert ex.cache.num_resident == 0
    assert torch.equal(ex.forward(0, x, ids, w), resident.forward(0, x, ids, w))


NORMED = [("resident", dict(num_slots=0)), ("offload", dict(num_slots=K)), ("cpu", dict(num_slots=K)),
          ("hybrid", dict(num_slots=6, hybrid_fraction=0.5)), ("offload", dict(num_slots=5, expert_cache="device"))]


@pytest.mark.parametrize("backend,kw", NORMED, ids=[f"{b}-{kw}" for b, kw in NORMED])
def test_forward_normed_is_forward_then_the_next_norm(store: ExpertStore, backend: str, kw: dict) -> None:
    # The next layer's input norm fused into the combine (or run after it, where the
    # executor does not fuse): bitwise the forward's h and the plain norm of it, padding
    # rows included (each executor's own forward: they treat padding rows differently).
    executor = make_executor(backend, store, torch.device("cpu"), F.silu, L, **kw)
    g = torch.Generator().manual_seed(2)
    norm = RMSNorm(torch.randn(H, generator=g) * 0.3 + 1, 1e-6)
    for x, ids, w in routings(seed=2, steps=5):
        residual, pad = torch.randn(x.shape, generator=g), min(1, x.shape[0] - 1)
        for layer in range(L):
            want = executor.forward(layer, x, ids, w, residual, num_padding=pad)
            h, normed = executor.forward_normed(layer, x, ids, w, residual, norm, num_padding=pad)
            assert torch.equal(h, want) and torch.equal(normed, norm(want))
    executor.close()
