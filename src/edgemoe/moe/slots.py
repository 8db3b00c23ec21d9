"""The expert slot cache: which (layer, expert) lives in which device slot, and what to load.

Pure bookkeeping, no device and no copies: `SlotCache` keeps the map
`[layer, expert] -> slot` (a CPU int32 tensor, -1 = not resident, so an executor can
mirror it to the device and index with it) and its inverse, and turns one layer's
routed experts into waves of hits and loads. The executor does the copies and compute.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch

from edgemoe.moe.policy import EvictionPolicy, Key, make_policy


class ExpertKey(NamedTuple):
    """One routed expert of one MoE layer."""

    layer: int
    expert: int


class MissLoad(NamedTuple):
    """A miss: copy host expert `expert` of the wave's layer into `slot`.

    `evicted` is who held the slot before (its map entry is already cleared), None if
    the slot was free.
    """

    expert: int
    slot: int
    evicted: ExpertKey | None


class LayerWave(NamedTuple):
    """One group of at most `capacity` (usually `num_slots`) experts of a layer, loaded
    then computed together.

    `experts[i]` runs from `slots[i]`. Hits come first: `experts[:num_hits]` were
    resident already; the rest are `misses`, in the same order, to be copied in.
    """

    layer: int
    experts: tuple[int, ...]
    slots: tuple[int, ...]
    num_hits: int
    misses: tuple[MissLoad, ...]

    @property
    def hits(self) -> tuple[int, ...]:
        return self.experts[: self.num_hits]

    @property
    def hit_mask(self) -> tuple[bool, ...]:
        return tuple(i < self.num_hits for i in range(len(self.experts)))


class Residency(NamedTuple):
    """A side-effect-free split of routed experts into resident and not (routed order)."""

    hits: tuple[int, ...]
    misses: tuple[int, ...]


@dataclass
class SlotCounters:
    """Running per-layer counters. Hits and misses count the layer's routed experts
    (once per `plan_layer`); evictions count by the layer of the expert that lost its slot.
    """

    hits: list[int]
    misses: list[int]
    evictions: list[int]

    @classmethod
    def zeros(cls, num_layers: int) -> SlotCounters:
        return cls([0] * num_layers, [0] * num_layers, [0] * num_layers)

    @property
    def total_hits(self) -> int:
        return sum(self.hits)

    @property
    def total_misses(self) -> int:
        return sum(self.misses)

    @property
    def total_evictions(self) -> int:
        return sum(self.evictions)

    @property
    def hit_rate(self) -> float:
        uses = self.total_hits + self.total_misses
        return self.total_hits / uses if uses else 0.0


class SlotCache:
    """A global pool of `num_slots` expert slots shared by all layers, and its map.

    Protocol, per MoE layer per forward step (`layer_waves` wraps it):
        waves = cache.plan_layer(layer, routed_experts)
        for wave in waves: copy wave.misses into their slots, then compute the wave
        cache.release_layer(layer)

    Contract:
    - A routed set no larger than `capacity` is one wave; a larger one is
      ceil(n / capacity) waves, hits first, so resident experts run before any load
      of the layer can evict them. Every routed expert is in exactly one wave.
      `capacity` is `num_slots` minus the keys pinned by other unreleased layers.
    - Protection: while a wave is planned, its own experts and every key pinned by an
      unreleased layer are protected; nothing else is (not earlier waves of the same
      layer, not other released layers). When `plan_layer` returns, the layer's
      routed experts that are still resident are pinned until `release_layer`.
    - Within a wave: `policy.begin_wave(layer)`, hits are touched in order, then the
      victims for all of the wave's misses are chosen at once (`policy.victims`), free
      slots are used first (lowest slot first), each miss in order takes the next free
      slot or evicts the next victim and is inserted into the policy, then
      `policy.end_wave(layer)`. Waves are never empty.
    - Layer ids are whatever the executor uses, 0 <= layer < num_layers (passing the
      model's total layer count is fine: dense layers just never appear).

    Lifetimes: the state is final when `plan_layer` returns, but the *copies* are the
    executor's: NOTE a miss of wave i+1 may take the slot of an expert of wave i (or of
    a released layer), so wave i must finish computing before wave i+1's copies land.
    The slots of the last wave stay valid until `release_layer`. NOTE `slot_map` shows
    the state after the *last* wave: compute an earlier wave from `wave.slots`, whose
    experts may already be unmapped (evicted by a later wave). `slot_map` and
    `slot_owners` are the same tensor objects for the cache's life, updated in place;
    `map_version` changes whenever they do, so a device mirror knows when to refresh.

    Locking: none; single-threaded by design (the engine's forward thread). A
    prefetcher on another thread must hand its plans to that thread or share a lock.
    """

    def __init__(
        self, num_slots: int, num_layers: int, num_experts: int, policy: EvictionPolicy | str = "lru"
    ) -> None:
        if num_slots < 1 or num_layers < 1 or num_experts < 1:
            raise ValueError(f"need positive sizes, got {num_slots=} {num_layers=} {num_experts=}")
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        if len(self.policy) != 0:
            raise ValueError("the policy must start empty: it tracks exactly the resident keys")
        self.num_slots, self.num_layers, self.num_experts = num_slots, num_layers, num_experts
        self.slot_map = torch.full((num_layers, num_experts), -1, dtype=torch.int32)  # [L, E]
        self.slot_owners = torch.full((num_slots, 2), -1, dtype=torch.int32)  # [S, (layer, expert)]
        # numpy views share the tensors' memory: element writes cost ~0.1 us, not ~5 us.
        self._map_flat = self.slot_map.numpy().reshape(-1)
        self._owners_np = self.slot_owners.numpy()
        self._slot_of: dict[Key, int] = {}  # resident key -> slot: the source of truth
        self._owner: list[Key] = [-1] * num_slots  # slot -> key, -1 = free
        self._free: list[int] = list(range(num_slots))  # min-heap of free slots
        self._pinned: dict[int, dict[Key, int]] = {}  # layer -> {key: slot} until release
        self.map_version = 0
        self.stats = SlotCounters.zeros(num_layers)

    # ---- keys and queries -------------------------------------------------------

    def pack(self, layer: int, expert: int) -> Key:
        """The policy key of (layer, expert): also its flat index into `slot_map`."""
        return layer * self.num_experts + expert

    def unpack(self, key: Key) -> ExpertKey:
        layer, expert = divmod(key, self.num_experts)
        return ExpertKey(layer, expert)

    @property
    def num_resident(self) -> int:
        return len(self._slot_of)

    @property
    def pinned_layers(self) -> frozenset[int]:
        return frozenset(self._pinned)

    @property
    def unpinned_capacity(self) -> int:
        """Slots a new `plan_layer` may use per wave: the pool minus pinned keys."""
        return self.num_slots - sum(len(p) for p in self._pinned.values())

    def lookup(self, layer: int, expert: int) -> int | None:
        """The slot holding (layer, expert), or None. Does not count as a use."""
        return self._slot_of.get(self.pack(layer, expert))

    def owner(self, slot: int) -> ExpertKey | None:
        key = self._owner[slot]
        return None if key < 0 else self.unpack(key)

    def resident_experts(self, layer: int) -> list[int]:
        """Resident experts of `layer`, ascending."""
        self._check_layer(layer)
        return torch.nonzero(self.slot_map[layer] >= 0).flatten().tolist()

    def partition(self, layer: int, experts: Sequence[int] | torch.Tensor) -> Residency:
        """Split routed experts (deduplicated, routed order) into resident and not.
        Read-only: a hybrid executor can use it to decide what to run where."""
        self._check_layer(layer)
        base, resident = layer * self.num_experts, self._slot_of
        hits, misses = [], []
        for e in self._routed(experts):
            (hits if base + e in resident else misses).append(e)
        return Residency(tuple(hits), tuple(misses))

    # ---- the per-layer protocol -------------------------------------------------

    def plan_layer(self, layer: int, experts: Sequence[int] | torch.Tensor) -> list[LayerWave]:
        """Assign a slot to every routed expert of `layer`, in waves; pin the layer.

        `experts` may repeat ids (duplicates collapse) and may be a tensor of ids.
        Raises RuntimeError if `layer` is already pinned, or if other pinned layers
        leave no slot at all for a non-empty routed set.
        """
        if layer in self._pinned:
            raise RuntimeError(f"layer {layer} is already pinned; release_layer it first")
        split = self.partition(layer, experts)
        ordered = split.hits + split.misses
        others: set[Key] = set().union(*self._pinned.values()) if self._pinned else set()
        capacity = self.num_slots - len(others)
        if ordered and capacity < 1:
            raise RuntimeError(f"all {self.num_slots} slots are pinned by layers {sorted(self._pinned)}")
        waves = [
            self._plan_wave(layer, ordered[i : i + capacity], others)
            for i in range(0, len(ordered), max(capacity, 1))
        ]
        base, resident = layer * self.num_experts, self._slot_of
        self._pinned[layer] = {base + e: resident[base + e] for e in ordered if base + e in resident}
        return waves

    def release_layer(self, layer: int) -> None:
        """End the protection `plan_layer(layer)` started. Raises KeyError if not pinned."""
        del self._pinned[layer]

    def clear(self) -> None:
        """Unpin everything and empty the pool (after a failed step: slot contents are
        unknown). Eviction counters are not charged."""
        self._pinned.clear()
        for key in list(self._slot_of):
            slot = self._slot_of.pop(key)
            self.policy.remove(key)
            self._owner[slot] = -1
            self._map_flat[key] = -1
            self._owners_np[slot] = -1
        self._free = list(range(self.num_slots))
        self.map_version += 1

    def release_all(self) -> None:
        """Unpin every layer (error paths: a forward aborted mid-layer)."""
        self._pinned.clear()

    @contextmanager
    def layer_waves(self, layer: int, experts: Sequence[int] | torch.Tensor) -> Iterator[list[LayerWave]]:
        """`plan_layer` on entry, `release_layer` on exit, also when the body raises."""
        waves = self.plan_layer(layer, experts)
        try:
            yield waves
        finally:
            self.release_layer(layer)

    def reset_stats(self) -> None:
        self.stats = SlotCounters.zeros(self.num_layers)

    # ---- internals --------------------------------------------------------------

    def _plan_wave(self, layer: int, experts: Sequence[int], others: set[Key]) -> LayerWave:
        base, resident = layer * self.num_experts, self._slot_of
        protected = others.union([base + e for e in experts])
        hits = [e for e in experts if base + e in resident]
        misses = [e for e in experts if base + e not in resident]
        self.policy.begin_wave(layer)
        for e in hits:
            self.policy.touch(base + e)
        n_free = min(len(misses), len(self._free))
        # Victims before taking free slots: if the policy raises, nothing has moved.
        victims = self.policy.victims(protected, len(misses) - n_free)
        free = [heapq.heappop(self._free) for _ in range(n_free)]
        if any(v in protected for v in victims):
            raise RuntimeError(f"policy {self.policy.name!r} chose a protected key among {victims}")
        loads = []
        for i, e in enumerate(misses):
            if i < n_free:
                slot, evicted = free[i], None
            else:
                victim = victims[i - n_free]
                slot, evicted = self._evict(victim), self.unpack(victim)
            self._assign(base + e, slot, layer, e)
            self.policy.insert(base + e)
            loads.append(MissLoad(e, slot, evicted))
        self.policy.end_wave(layer)
        self.stats.hits[layer] += len(hits)
        self.stats.misses[layer] += len(misses)
        if misses:
            self.map_version += 1
        return LayerWave(
            layer=layer,
            experts=(*hits, *misses),
            slots=(*[resident[base + e] for e in hits], *[m.slot for m in loads]),
            num_hits=len(hits),
            misses=tuple(loads),
        )

    def _evict(self, key: Key) -> int:
        slot = self._slot_of.pop(key)
        self.policy.remove(key)
        self._owner[slot] = -1
        self._map_flat[key] = -1
        self._owners_np[slot] = -1
        self.stats.evictions[key // self.num_experts] += 1
        return slot

    def _assign(self, key: Key, slot: int, layer: int, expert: int) -> None:
        self._slot_of[key] = slot
        self._owner[slot] = key
        self._map_flat[key] = slot
        self._owners_np[slot, 0] = layer
        self._owners_np[slot, 1] = expert

    def _routed(self, experts: Sequence[int] | torch.Tensor) -> list[int]:
        ids = experts.flatten().tolist() if isinstance(experts, torch.Tensor) else [int(e) for e in experts]
        ids = list(dict.fromkeys(ids))  # dedupe, keep routed order
        bad = [e for e in ids if not 0 <= e < self.num_experts]
        if bad:
            raise ValueError(f"expert ids {bad} out of range [0, {self.num_experts})")
        return ids

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} out of range [0, {self.num_layers})")

    # ---- invariants (tests call this after every step) ----------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant. O(L*E + S)."""
        _require(self.num_resident <= self.num_slots, "more resident keys than slots")
        for key, slot in self._slot_of.items():
            _require(0 <= slot < self.num_slots, f"key {key} maps to bad slot {slot}")
            owner = self._owner[slot]
            _require(owner == key, f"slot {slot}: map says key {key}, inverse says {owner}")
        free = [s for s, k in enumerate(self._owner) if k < 0]
        _require(sorted(self._free) == free, "free list disagrees with the inverse map")
        _require(len(free) + self.num_resident == self.num_slots, "a slot holds two keys")
        expected_map = torch.full((self.num_layers * self.num_experts,), -1, dtype=torch.int32)
        expected_owners = torch.full((self.num_slots, 2), -1, dtype=torch.int32)
        for key, slot in self._slot_of.items():
            expected_map[key] = slot
            expected_owners[slot] = torch.tensor(divmod(key, self.num_experts), dtype=torch.int32)
        _require(torch.equal(self.slot_map.flatten(), expected_map), "slot_map tensor is stale")
        _require(torch.equal(self.slot_owners, expected_owners), "slot_owners tensor is stale")
        _require(set(self.policy.keys()) == set(self._slot_of), "policy keys != resident keys")
        _require(len(self.policy) == self.num_resident, "policy size != resident count")
        for layer, pins in self._pinned.items():
            for key, slot in pins.items():
                _require(key // self.num_experts == layer, f"layer {layer} pins foreign key {key}")
                _require(self._slot_of.get(key) == slot, f"pinned key {key} was evicted or moved")


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"SlotCache invariant broken: {what}")
