"""Preloading the device cache's slots (`moe/slot_preload.py`): the state a preload leaves
is the Python `SlotCache`'s after planning the same experts, every preloaded slot holds
its expert's weights, no hit or miss is counted for it, a lendable tail stays empty, and
outputs stay the resident executor's while the first steps hit the preloaded experts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.registry import make_executor
from edgemoe.moe.slot_preload import (
    layer_shares,
    preload_executor,
    preload_pool,
    preload_wanted,
    restart_pool,
    spread_experts,
)
from edgemoe.moe.offload import OffloadExecutor
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import random_bank_store

L, E, K, H, I = 3, 8, 2, 16, 12
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def store() -> BankStore:
    return random_bank_store(L, E, H, I)


def test_shares_are_equal_and_spread_over_the_ids() -> None:
    assert layer_shares(10, 3, 8) == [4, 3, 3]
    assert layer_shares(100, 3, 8) == [8, 8, 8]  # never more than a layer's experts
    assert layer_shares(2, 3, 8) == [1, 1, 0]
    assert spread_experts(4, 8) == [0, 2, 4, 6]
    assert spread_experts(3, 128) == [0, 42, 85]
    assert len(set(spread_experts(127, 128))) == 127


def test_auto_preloads_unless_the_store_reads_from_disk() -> None:
    assert preload_wanted("auto", "pinned") and preload_wanted("auto", "ram")
    assert not preload_wanted("auto", "mmap") and preload_wanted("on", "mmap")
    assert not preload_wanted("off", "pinned")
    with pytest.raises(ValueError, match="--expert-preload"):
        preload_wanted("yes", "pinned")


@pytest.mark.parametrize("slots", [K, 7, L * E])
def preloaded(store: BankStore, slots: int, cache: str) -> OffloadExecutor | DeviceOffloadExecutor:
    executor = make_executor("offload", store, CPU, F.silu, L, slots, expert_cache=cache)
    assert preload_executor(executor) == min(slots, L * E) == executor.stats.info["preloaded_experts"]
    return executor


@pytest.mark.parametrize("slots", [K, 7, L * E])
def test_preload_fills_both_caches_alike_with_the_weights(store: BankStore, slots: int) -> None:
    dev, host = preloaded(store, slots, "device"), preloaded(store, slots, "host")
    assert isinstance(dev, DeviceOffloadExecutor)
    assert torch.equal(dev.cache.slot_map, host.cache.slot_map)
    assert torch.equal(host.slot_map, host.cache.slot_map)  # the host cache's device mirror
    for executor in (dev, host):
        for layer, share in enumerate(layer_shares(slots, L, E)):
            held = (executor.cache.slot_map[layer] >= 0).nonzero().flatten().tolist()
            assert held == spread_experts(share, E) if share else held == []
            for expert in held:
                slot = int(executor.cache.slot_map[layer, expert])
                gate_up, down = store.expert(layer, expert)
                assert torch.equal(executor.slots.gate_up[slot], gate_up)
                assert torch.equal(executor.slots.down[slot], down)
        snap = executor.stats.snapshot()  # no request caused them
        assert snap["hits"] == snap["misses"] == snap["bytes_copied"] == 0
    assert not dev.cache.events.any()


@pytest.mark.parametrize("slots", [6, 12, 20])
def test_outputs_stay_resident_and_decisions_the_host_caches(store: BankStore, slots: int) -> None:
    dev, host = preloaded(store, slots, "device"), preloaded(store, slots, "host")
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    g = torch.Generator().manual_seed(slots)
    for step in range(4):
        T = 1 + 2 * step
        x = torch.randn(T, H, generator=g)
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        for layer in range(L):
            want = resident.forward(layer, x, ids, w)
            assert torch.equal(dev.forward(layer, x, ids, w), want)
            assert torch.equal(host.forward(layer, x, ids, w), want)
            assert torch.equal(dev.cache.slot_map, host.cache.slot_map), (step, layer)
    got, want = dev.stats.snapshot(), host.stats.snapshot()
    assert got["hits"] == want["hits"] > 0 and got["misses"] == want["misses"]
    assert got["bytes_copied"] == want["bytes_copied"]


def test_a_lendable_tail_stays_empty(store: BankStore) -> None:
    dev = make_executor("offload", store, CPU, F.silu, L, 20, expert_cache="device")
    assert isinstance(dev, DeviceOffloadExecutor)
    copied = preload_pool(dev.cache, dev.slots, list(store.layers), 12)
    assert copied == 12
    assert (dev.cache.slot_owners[:12] >= 0).all() and (dev.cache.slot_owners[12:] < 0).all()
    with pytest.raises(ValueError, match="cannot preload"):
        preload_pool(dev.cache, dev.slots, list(store.layers), 21)


@pytest.mark.parametrize("cache", ["host", "device"])
def test_restart_puts_the_start_up_pool_back(store: BankStore, cache: str) -> None:
    fresh, used = preloaded(store, 12, cache), preloaded(store, 12, cache)
    x, w = torch.randn(4, H), torch.full((4, K), 0.5)
    ids = torch.tensor([[1, 3], [5, 7], [1, 5], [3, 7]], dtype=torch.int32)
    for layer in range(L):
        used.forward(layer, x, ids, w)
    assert not torch.equal(used.cache.slot_map, fresh.cache.slot_map)
    restart_pool(used)
    assert torch.equal(used.cache.slot_map, fresh.cache.slot_map)
    restart_pool(make_executor("resident", store, CPU, F.silu, L, 0))  # no pool: nothing to do
    cold = make_executor("offload", store, CPU, F.silu, L, 12, expert_cache=cache)
    for layer in range(L):
        cold.forward(layer, x, ids, w)
    restart_pool(cold)  # never preloaded: emptied
    assert (cold.cache.slot_map < 0).all()
