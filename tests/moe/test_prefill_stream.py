"""Streamed prefill (moe/prefill_stream.py) on CPU against the resident executor: long
chunks (mixed with decode rows, over float and int8 banks) give bitwise the resident
outputs, leave the cache as it was but for the lent slots (now free), count copied
experts as misses and routed resident ones as hits; steps after it plan as before; a
pool under 2·E slots never streams."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.prefill_stream import stream_min_tokens
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import quantised_store, random_bank_store

L, E, K, H, I = 3, 8, 2, 16, 12
CPU = torch.device("cpu")
STREAM = 6  # chunks of 6 prompt rows or more stream here


@pytest.fixture(scope="module")
def store() -> BankStore:
    return random_bank_store(L, E, H, I, seed=1)


def _step(g: torch.Generator, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
    return x, ids, torch.softmax(torch.randn(T, K, generator=g), -1)


def _device(store, slots: int) -> DeviceOffloadExecutor:  # noqa: ANN001
    ex = make_executor("offload", store, CPU, F.silu, L, slots, expert_cache="device")
    assert isinstance(ex, DeviceOffloadExecutor)
    ex.streaming.min_tokens = STREAM if slots >= 2 * E else 0  # as the constructor would with stream_tokens
    return ex


@pytest.mark.parametrize("quantised", [False, True])
def test_streamed_chunks_match_resident_and_leave_the_cache_as_it_was(store: BankStore, quantised: bool) -> None:
    src = quantised_store(store) if quantised else store
    dev, resident = _device(src, 2 * E + 4), make_executor("resident", src, CPU, F.silu, L, 0)
    g = torch.Generator().manual_seed(2)
    for T, num_decode in [(3, 0), (1, 0), (9, 0), (2, 0), (11, 3), (1, 0)]:  # planned, streamed (9, 11-3) between
        x, ids, w = _step(g, T)
        before = dev.cache.slot_map.clone()
        streamed = T - num_decode >= STREAM
        for layer in range(L):
            got = dev.forward(layer, x, ids, w, num_decode=num_decode)
            assert torch.equal(got, resident.forward(layer, x, ids, w, num_decode=num_decode))
            assert dev.streaming.active == (streamed and layer < L - 1)
        if streamed:  # lent slots left the map; every other entry is as before
            kept = dev.cache.slot_map >= 0
            assert torch.equal(dev.cache.slot_map[kept], before[kept])
            lent = set(dev.streaming._buffers.reshape(-1).tolist())
            assert len(lent) == 2 * E and not lent & set(dev.cache.slot_map[kept].tolist())
            assert (dev.cache.slot_owners[list(lent)] == -1).all()


def test_streamed_counts_copies_as_misses_and_routed_residents_as_hits(store: BankStore) -> None:
    dev = _device(store, 4 * E)
    g = torch.Generator().manual_seed(3)
    x, ids, w = _step(g, 2)
    for layer in range(L):  # a planned step: 2 tokens' experts come in
        dev.forward(layer, x, ids, w)
    dev.stats.snapshot()  # drain the planned step's counts
    hits0, misses0, bytes0 = list(dev.stats.hits), list(dev.stats.misses), dev.stats.bytes_copied
    held_before = dev.cache.slot_map.clone()
    x, ids, w = _step(g, 8)
    for layer in range(L):
        dev.forward(layer, x, ids, w)
    # Lent slots: the free ones first (20 of 4E are free), so nothing held is lent here.
    assert torch.equal(dev.cache.slot_map, held_before)
    snap = dev.stats.snapshot()
    for layer in range(L):
        held = held_before[layer] >= 0
        routed = torch.zeros(E, dtype=torch.bool)
        routed[ids.long().reshape(-1)] = True
        assert dev.stats.misses[layer] - misses0[layer] == int((~held).sum())  # every non-held expert was copied
        assert dev.stats.hits[layer] - hits0[layer] == int((held & routed).sum())
    copied = sum(dev.stats.misses) - sum(misses0)
    assert snap["bytes_copied"] - bytes0 == copied * store.expert_nbytes


def test_lend_takes_free_slots_first_then_the_least_recent(store: BankStore) -> None:
    dev = _device(store, 2 * E + 2)
    g = torch.Generator().manual_seed(4)
    for T in (2, 2, 2, 2):  # fill the pool by planned steps
        x, ids, w = _step(g, T)
        for layer in range(L):
            dev.forward(layer, x, ids, w)
    cache = dev.cache
    free = (cache.slot_owners < 0).nonzero().reshape(-1).tolist()
    owned = (cache.slot_owners >= 0).nonzero().reshape(-1)
    by_age = owned[torch.argsort(cache.recency[owned])].tolist()
    n = len(free) + 3
    lent = cache.lend(n).tolist()
    assert lent == free + by_age[:3]
    assert (cache.slot_owners[lent] == -1).all() and not set(lent) & set(cache.slot_map[cache.slot_map >= 0].tolist())
    with pytest.raises(ValueError, match="cannot lend"):
        cache.lend(cache.num_slots + 1)


def test_a_pool_under_two_layers_never_streams(store: BankStore) -> None:
    ex = make_executor("offload", store, CPU, F.silu, L, 2 * E - 1, expert_cache="device", stream_tokens=1)
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    assert ex.streaming.min_tokens == 0
    x, ids, w = _step(torch.Generator().manual_seed(5), 12)
    for layer in range(L):
        assert torch.equal(ex.forward(layer, x, ids, w), resident.forward(layer, x, ids, w))
        assert not ex.streaming.active


def test_the_threshold_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEMOE_PREFILL_STREAM_TOKENS", raising=False)
    assert stream_min_tokens() == 1024
    monkeypatch.setenv("EDGEMOE_PREFILL_STREAM_TOKENS", "0")
    assert stream_min_tokens() == 0
    monkeypatch.setenv("EDGEMOE_PREFILL_STREAM_TOKENS", "lots")
    with pytest.raises(ValueError, match="EDGEMOE_PREFILL_STREAM_TOKENS"):
        stream_min_tokens()
