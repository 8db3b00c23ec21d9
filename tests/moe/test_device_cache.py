"""The device slot cache decides exactly what the Python `SlotCache` with the same policy
("lru", scan-resistant, and "lru-plain") decides: same waves, misses, slots, evictions,
recency and counters, on randomized traces (pools down to exactly top-k slots, batches
routing more experts than the pool, padding rows, other layers' pins, a layer cycle
larger than the pool); and its plan is shape-static and never reads the device."""

from __future__ import annotations

import random

import pytest
import torch
from expert_traces import CONFIGS, routing
from torch.utils._python_dispatch import TorchDispatchMode

from edgemoe.moe.device_cache import DeviceSlotCache, WavePlan
from edgemoe.moe.policy import ScanLRUPolicy
from edgemoe.moe.slots import LayerWave, SlotCache

CPU = torch.device("cpu")


def wave_slot_ids(wave: LayerWave, ids: torch.Tensor) -> torch.Tensor:
    """What `WavePlan.slot_ids` must be for a Python wave: its experts' slots, -1 elsewhere."""
    slot_of = dict(zip(wave.experts, wave.slots, strict=True))
    return torch.tensor([[slot_of.get(int(e), -1) for e in row] for row in ids], dtype=torch.int32)


def check_wave(plan: WavePlan, wave: LayerWave | None, ids: torch.Tensor) -> None:
    misses = [(int(e), int(s)) for e, s in plan.misses.T.tolist() if e >= 0]
    assert not bool(plan.overflow)
    if wave is None:  # a static trailing wave the Python cache does not have: empty
        assert misses == [] and bool((plan.slot_ids == -1).all()) and not bool(plan.hits.any())
        return
    assert misses == [(m.expert, m.slot) for m in wave.misses]
    assert torch.equal(plan.slot_ids, wave_slot_ids(wave, ids))
    hit_experts = set(ids[plan.hit_pairs(ids)].tolist())
    assert hit_experts == set(wave.hits)


def check_state(py: SlotCache, dev: DeviceSlotCache) -> None:
    E = py.num_experts
    assert torch.equal(dev.slot_map, py.slot_map)
    owners = py.slot_owners[:, 0].long() * E + py.slot_owners[:, 1].long()
    assert torch.equal(dev.slot_owners, torch.where(py.slot_owners[:, 0] >= 0, owners, -1))
    if isinstance(py.policy, ScanLRUPolicy):  # the same stamps, clock and per-layer wave ends
        owned = dev.slot_owners >= 0
        stamps = [py.policy.stamp(k) for k in dev.slot_owners[owned].tolist()]
        assert dev.recency[owned].tolist() == stamps
        assert int(dev.clock) == py.policy.clock
        assert dev.wave_end.tolist() == [py.policy.wave_end(layer) for layer in range(py.num_layers)]
    else:  # LRU order through the policy's contract: all victims, best first, none protected.
        assert dev.lru_order() == py.policy.victims(set(), len(py.policy))


def run_layer(py: SlotCache, dev: DeviceSlotCache, layer: int, ids: torch.Tensor, live: torch.Tensor) -> None:
    """Plan one layer in both; `live` [T] bool: the rows that are real (the rest padding)."""
    dev_ids = torch.where(live[:, None], ids, -1)
    # The host executors plan a layer's distinct experts ascending (`np.unique`).
    with py.layer_waves(layer, torch.unique(ids[live])) as waves:
        plans = list(dev.layer_waves(layer, dev_ids))
        assert len(plans) >= len(waves)
        for i, plan in enumerate(plans):
            check_wave(plan, waves[i] if i < len(waves) else None, dev_ids)
    check_state(py, dev)


def pair(S: int, L: int, E: int, policy: str = "lru") -> tuple[SlotCache, DeviceSlotCache]:
    """The Python reference and the device cache (torch plan), empty, on one policy."""
    return SlotCache(S, L, E, policy), DeviceSlotCache(S, L, E, CPU, policy=policy)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "L{}-E{}-S{}-K{}".format(*c[:4]))
@pytest.mark.parametrize("seed,policy", [(0, "lru"), (1, "lru"), (0, "lru-plain")])
def test_random_traces_match_the_python_cache(config: tuple, seed: int, policy: str) -> None:
    L, E, S, K, sizes = config
    rng = random.Random(seed * 1000 + S)
    py, dev = pair(S, L, E, policy)
    for step in range(14):
        T = rng.choice(sizes)
        live = torch.tensor([True] * T + [False] * (step % 3))  # some steps padded
        for layer in range(L):
            ids = routing(rng, len(live), E, K, skew=rng.choice([0.0, 1.2]))
            run_layer(py, dev, layer, ids, live)
    counts = dev.read_counts()
    assert counts[:, 0].tolist() == py.stats.hits and counts[:, 1].tolist() == py.stats.misses
    assert py.stats.total_misses > 0
    if S >= L * K:  # a smaller pool may evict every layer's experts before they repeat
        assert py.stats.total_hits > 0


@pytest.mark.parametrize("policy", ["lru", "lru-plain"])
def test_every_expert_at_once_with_the_pool_at_top_k(policy: str) -> None:
    L, E, S, K = 2, 8, 2, 2
    py, dev = pair(S, L, E, policy)
    ids = torch.stack([torch.arange(E).roll(t)[:K] for t in range(E)]).int()  # every expert routed
    for layer in (0, 1, 0):
        run_layer(py, dev, layer, ids, torch.ones(E, dtype=torch.bool))
    assert dev.num_waves(ids.numel()) == E // S


def test_pins_of_another_layer_are_respected() -> None:
    """A layer planned but not released (the Python cache pins its experts) shrinks the
    next layer's capacity and protects its slots: the device cache is given them as `pinned`."""
    L, E, S, K = 3, 8, 5, 2
    rng = random.Random(7)
    py, dev = pair(S, L, E)
    for _ in range(4):
        for layer in range(L):
            run_layer(py, dev, layer, routing(rng, 3, E, K, 1.0), torch.ones(3, dtype=torch.bool))
    ids_a = routing(rng, 2, E, K, 1.0)
    py.plan_layer(0, torch.unique(ids_a))
    list(dev.layer_waves(0, ids_a))
    pinned_slots = [s for pins in py._pinned.values() for s in pins.values()]
    pinned = torch.zeros(S, dtype=torch.bool)
    pinned[pinned_slots] = True
    ids_b = routing(rng, 4, E, K, 0.0)
    waves = py.plan_layer(1, torch.unique(ids_b))
    plans = list(dev.layer_waves(1, ids_b, pinned, len(pinned_slots)))
    assert len(pinned_slots) > 0 and len(waves) > 1  # the pins forced waves
    for i, plan in enumerate(plans):
        check_wave(plan, waves[i] if i < len(waves) else None, ids_b)
    check_state(py, dev)
    assert all(int(dev.slot_map.view(-1)[py.pack(0, e)]) >= 0 for e in set(ids_a.flatten().tolist()))


@pytest.mark.parametrize("policy", ["lru", "lru-plain"])
def test_a_layer_cycle_larger_than_the_pool(policy: str) -> None:
    """6 layers x top-2 (12 keys a step) through 9 slots, the same experts every step, with
    padding rows: plain LRU never hits, the scan-resistant rule does (Belady's choice once
    no key is stale); both exactly as `SlotCache` decides."""
    L, E, S = 6, 8, 9  # top-2: each layer routes experts (layer, layer + 2)
    py, dev = pair(S, L, E, policy)
    live, idle = torch.tensor([True, False]), torch.tensor([False, False])  # padding rows route nothing
    hits = []
    for step in range(8):
        before = py.stats.total_hits
        for layer in range(L):
            ids = torch.tensor([[layer, layer + 2], [layer, layer + 2]], dtype=torch.int32)
            # a layer with nothing routed has no wave: its cycle (wave_end) must not move
            run_layer(py, dev, layer, ids, idle if (step, layer) == (4, 3) else live)
        hits.append(py.stats.total_hits - before)
    if policy == "lru-plain":  # the idle layer's step shortens the cycle (some hits), then it thrashes again
        assert hits[2:4] == [0, 0] and hits[-1] == 0, hits
    else:
        assert min(hits[2:]) > 0, hits
    assert dev.read_counts()[:, 0].tolist() == py.stats.hits


def test_a_wave_past_capacity_is_flagged_not_corrupting() -> None:
    """`plan_wave` alone (no wave split) with more misses than slots: flagged, extra misses
    get no slot (-1), and the cache stays consistent."""
    dev = DeviceSlotCache(2, 1, 8, CPU)
    plan = dev.plan_wave(0, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    assert bool(plan.overflow)
    assert plan.slot_ids.tolist() == [[0, 1], [-1, -1]]
    assert plan.misses.tolist() == [[0, 1], [0, 1]]
    assert dev.slot_map[0].tolist() == [0, 1, -1, -1, -1, -1, -1, -1]


def test_clear_empties_the_pool() -> None:
    dev = DeviceSlotCache(4, 2, 8, CPU)
    list(dev.layer_waves(1, torch.tensor([[1, 2]], dtype=torch.int32)))
    dev.clear()
    assert bool((dev.slot_map == -1).all()) and bool((dev.slot_owners == -1).all())
    plan = dev.plan_wave(1, torch.tensor([[1, 2]], dtype=torch.int32))
    assert plan.misses.tolist() == [[1, 2], [0, 1]]  # misses again, lowest free slots


class _OpLog(TorchDispatchMode):
    """Every aten op a block of code runs (what a CUDA graph would capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


# Ops whose output shape depends on data, or that copy a device value to the host.
HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item", "tolist"}


@pytest.mark.parametrize("T", [1, 6])  # one wave, and many (6 × 2 pairs > 2 slots)
def test_the_plan_is_shape_static_and_never_reads_the_device(T: int) -> None:
    dev = DeviceSlotCache(2, 2, 8, CPU)
    rng = random.Random(T)
    shapes = set()
    for _ in range(3):
        ids = routing(rng, T, 8, 2, 0.0)
        with _OpLog() as log:
            plans = list(dev.layer_waves(1, ids))
        assert HOST_READS.isdisjoint(log.ops), sorted(HOST_READS & set(log.ops))
        shapes.add(tuple((p.slot_ids.shape, p.misses.shape) for p in plans))
    assert len(shapes) == 1  # the same shapes whatever was routed
