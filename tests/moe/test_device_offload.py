"""The device-cache offload executor against the host-cache one on CPU: bitwise the same
outputs (and the resident executor's), the same slot map after every call, the same
hits / misses / bytes (counted on the device, read only when asked), with both movers,
at pools down to top-k, with waves, padding rows and quantised banks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.movers import CopyEngineMover, GatherMover
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import quantised_store, random_bank_store

L, E, K, H, I = 3, 8, 2, 16, 12
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def store() -> BankStore:
    return random_bank_store(L, E, H, I)


@pytest.fixture(scope="module")
def int8_store(store: BankStore) -> PartsStore:
    return quantised_store(store)


def routings(seed: int, steps: int = 10):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        T = [1, 1, 3, 7, 16][step % 5]
        x = torch.randn(T, H, generator=g)
        # Skewed: experts 0-2 are popular, so small pools hit too.
        probs = torch.tensor([6.0, 4.0, 3.0] + [1.0] * (E - 3))
        ids = torch.stack([torch.multinomial(probs, K, generator=g) for _ in range(T)]).int()
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        yield x, ids, w


@pytest.mark.parametrize(
    "slots,mover,policy",
    [(s, m, "lru") for s in (K, 5, L * E) for m in ("gather", "copy")]  # top-k (waves), a small pool, everything
    + [(5, "gather", "lru-plain")],
)
def test_same_outputs_decisions_and_stats_as_the_host_cache(store: BankStore, slots: int, mover: str, policy: str) -> None:
    host = make_executor("offload", store, CPU, F.silu, L, slots, policy=policy)
    dev = make_executor("offload", store, CPU, F.silu, L, slots, policy=policy, expert_cache="device",
                        expert_mover=mover)
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    assert isinstance(dev, DeviceOffloadExecutor)
    assert isinstance(dev.mover, GatherMover if mover == "gather" else CopyEngineMover)
    for x, ids, w in routings(seed=slots):
        for layer in range(L):
            want = host.forward(layer, x, ids, w)
            assert torch.equal(dev.forward(layer, x, ids, w), want)
            assert torch.equal(want, resident.forward(layer, x, ids, w))
            assert torch.equal(dev.cache.slot_map, host.cache.slot_map)
    assert dev.stats.hits == [0] * L and dev.stats.bytes_copied == 0  # nothing read until asked
    got, want = dev.stats.snapshot(), host.stats.snapshot()
    for key in ("hits", "misses", "bytes_copied", "tokens", "hit_rate_by_layer", "misses_per_token_by_layer"):
        assert got[key] == want[key], key
    assert got["misses"] > 0 and got["expert_cache"] == "device" and got["expert_mover"] == mover
    assert got["expert_policy"] == want["expert_policy"] == policy
    if slots > K:  # at top-k slots each layer evicts the one before: nothing ever hits
        assert got["hits"] > 0


def test_every_expert_routed_with_the_pool_at_top_k_runs_in_waves(store: BankStore) -> None:
    dev = make_executor("offload", store, CPU, F.silu, L, K, expert_cache="device")
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    x = torch.randn(E, H)
    ids = torch.stack([torch.arange(E).roll(t)[:K] for t in range(E)]).int()
    w = torch.full((E, K), 0.5)
    assert torch.equal(dev.forward(0, x, ids, w), resident.forward(0, x, ids, w))
    snap = dev.stats.snapshot()
    assert snap["misses"] == E and snap["bytes_copied"] == E * store.expert_nbytes


@pytest.mark.parametrize("how", ["num_padding", "live_rows"])
def test_padding_rows_route_nothing(store: BankStore, how: str) -> None:
    """Padding rows load nothing and count nothing; real rows match the host cache, which
    drops them; their outputs are zeros."""
    host = make_executor("offload", store, CPU, F.silu, L, 4)
    dev = make_executor("offload", store, CPU, F.silu, L, 4, expert_cache="device")
    for x, ids, w in routings(seed=9, steps=6):
        pad = 2
        xp = torch.cat([x, torch.randn(pad, H)])
        idsp = torch.cat([ids, torch.tensor([[E - 1, E - 2]] * pad, dtype=torch.int32)])
        wp = torch.cat([w, torch.full((pad, K), 0.5)])
        live = torch.arange(len(xp)) < len(x)
        dev.set_live_rows(live if how == "live_rows" else None)
        for layer in range(L):
            want = host.forward(layer, xp, idsp, wp, num_padding=pad)
            got = dev.forward(layer, xp, idsp, wp, num_padding=pad if how == "num_padding" else 0)
            assert torch.equal(got, want)  # the host pads with zeros too
            assert torch.equal(dev.cache.slot_map, host.cache.slot_map)
    dev.set_live_rows(None)
    assert dev.stats.snapshot()["misses"] == host.stats.snapshot()["misses"]


@pytest.mark.parametrize("mover", ["gather", "copy"])
def test_quantised_banks_move_every_part(store: BankStore, int8_store: PartsStore, mover: str) -> None:
    host = make_executor("offload", int8_store, CPU, F.silu, L, 3)
    dev = make_executor("offload", int8_store, CPU, F.silu, L, 3, expert_cache="device", expert_mover=mover)
    assert set(dev.slots.parts) == {"gate_up", "gate_up_scale", "down", "down_scale"}
    for x, ids, w in routings(seed=4, steps=5):
        for layer in range(L):
            assert torch.equal(dev.forward(layer, x, ids, w), host.forward(layer, x, ids, w))
    for name, bank in dev.slots.parts.items():  # every slot holds its owner's bytes
        for slot, key in enumerate(dev.cache.slot_owners.tolist()):
            if key >= 0:
                assert torch.equal(bank[slot], int8_store.banks[key // E][name][key % E]), name


def test_recover_empties_the_cache_and_stays_correct(store: BankStore) -> None:
    dev = make_executor("offload", store, CPU, F.silu, L, 5, expert_cache="device")
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    x, ids, w = next(routings(seed=5))
    dev.forward(0, x, ids, w)
    dev.recover()
    assert not dev.resident_mask().any()
    assert torch.equal(dev.forward(0, x, ids, w), resident.forward(0, x, ids, w))


def test_activity_marks_reach_the_live_view(store: BankStore) -> None:
    dev = make_executor("offload", store, CPU, F.silu, L, 5, expert_cache="device")
    dev.stats.watch(E)
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    x, w = torch.randn(1, H), torch.full((1, K), 0.5)
    dev.forward(1, x, ids, w)
    dev.forward(1, x, torch.tensor([[1, 2]], dtype=torch.int32), w)
    dev.stats.resolve()
    row = dev.stats.activity.take([1], dev.resident_mask())[0]
    assert row[:4] == "3330"  # 0 missed, 1 missed then hit (the strongest: miss), 2 missed, 3 idle


def test_what_the_device_cache_cannot_run_is_refused(store: BankStore) -> None:
    with pytest.raises(ValueError, match="lru or lru-plain only"):
        make_executor("offload", store, CPU, F.silu, L, 4, policy="lfu", expert_cache="device")
    with pytest.raises(ValueError, match="not 'cpu'"):
        make_executor("cpu", store, CPU, F.silu, L, 4, expert_cache="device")
    with pytest.raises(ValueError, match="expert_mover"):
        make_executor("offload", store, CPU, F.silu, L, 4, expert_cache="device", expert_mover="dma")


def test_counts_drain_once_per_read(store: BankStore) -> None:
    """Each resolve adds only what happened since the last one."""
    dev = make_executor("offload", store, CPU, F.silu, L, 5, expert_cache="device")
    x, w = torch.randn(1, H), torch.full((1, K), 0.5)
    dev.forward(0, x, torch.tensor([[0, 1]], dtype=torch.int32), w)
    dev.stats.resolve()
    dev.stats.resolve()
    assert dev.stats.misses[0] == 2 and dev.stats.hits[0] == 0
    dev.forward(0, x, torch.tensor([[1, 2]], dtype=torch.int32), w)
    dev.stats.resolve()
    assert dev.stats.misses[0] == 3 and dev.stats.hits[0] == 1
    assert dev.stats.bytes_copied == 3 * store.expert_nbytes


def test_expert_cache_auto_is_the_device_on_a_gpu_for_offload_hybrid_and_auto() -> None:
    from edgemoe.moe.cache_choice import resolve_expert_cache

    assert resolve_expert_cache("auto", "cuda", "offload", "lru") == "device"
    assert resolve_expert_cache("auto", "cuda", "auto", "lru") == "device"
    assert resolve_expert_cache("auto", "cuda", "offload", "lru-plain") == "device"  # A/B runs of the two LRUs
    assert resolve_expert_cache("auto", "cuda", "hybrid", "lru") == "device"  # with a live CPU quota
    # the cpu backend needs the host cache; LFU and the CPU have no device cache
    for backend, policy, device in (("cpu", "lru", "cuda"), ("auto", "lfu", "cuda"),
                                    ("offload", "lru", "cpu"), ("auto", "lru", "cpu")):
        assert resolve_expert_cache("auto", device, backend, policy) == "host"
    assert resolve_expert_cache("host", "cuda", "offload", "lru") == "host"  # an explicit choice stands
    assert resolve_expert_cache("device", "cpu", "offload", "lru") == "device"
