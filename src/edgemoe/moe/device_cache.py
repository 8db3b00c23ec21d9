"""The expert slot cache on the device: the slot map, slot owners and recency are device
tensors and the truth; one layer's bookkeeping is a fixed sequence of device ops.

`DeviceSlotCache.layer_waves(layer, topk_ids)` plans a layer without reading anything
back: which routed experts are resident, which slots the misses take (free slots, then
the policy's victims), the map/owner/recency updates, the slot ids `[T, K]` for the
slot-addressed MoE, and a fixed-size miss list `[2, M]` (expert ids, destination slots;
-1 padded) for a mover (`moe/movers.py`). Every shape depends only on T, K, E and S, and
no op reads a device value on the host, so it runs inside a CUDA graph. On CUDA a wave
is one fused Triton launch (`kernels/slot_plan.py`, the same decisions and updates); the
torch ops below are its reference and the path on CPU.

It decides exactly what `SlotCache` (moe/slots.py) with the same policy decides on the
same trace: "lru" (`ScanLRUPolicy`, scan-resistant, the default) or "lru-plain"
(`LRUPolicy`); the Python cache stays the reference it is tested against
(tests/moe/test_device_cache.py). The rules, restated for the device:

- Routed order: a layer's distinct experts by ascending id, as the host executors hand
  them to `SlotCache` (`np.unique` of the routing); -1 entries are not routed (padding
  rows, other waves).
- A wave: its resident experts (hits) first, then its misses, each in routed order.
  Every expert used in a wave is stamped with the next recency value in that order
  (hits, then misses), so recency orders uses exactly as the LRU list does.
- Victims: the i-th miss takes the i-th slot in the order "free slots by index, then
  unprotected resident slots in the policy's order". Protected: slots holding an expert
  routed in this wave, and `pinned` slots (held by another layer's unreleased plan).
  "lru-plain": ascending recency. "lru": stale slots (recency below `wave_end[layer]`,
  the clock when this layer's last wave ended) by ascending recency, then the fresh ones
  by descending recency (`ScanLRUPolicy` says why).
- `wave_end[layer]`: after a wave that routed anything, the clock (both policies keep it).
- Waves: a layer whose routed set exceeds the pool's capacity (S minus pinned slots)
  runs as ceil(min(T·K, E) / capacity) waves; wave w is the slice [w·cap, (w+1)·cap) of
  the layer's order fixed before its first wave (hits, then misses). The count is
  static: trailing waves may be empty and then change nothing.

NOTE (tie-breaking): recency values are unique (a global use counter advanced by each
wave's number of uses), so neither order has ties; free slots go lowest index first, as the
Python cache's min-heap gives them out. That is what makes the two caches identical.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

from edgemoe.kernels.slot_keys import FRESH, NEVER
from edgemoe.kernels.slot_plan import SlotState, fused_plan_supported, plan_wave_fused
from edgemoe.moe.activity import HIT, MISS
from edgemoe.moe.cache_choice import DEVICE_POLICIES


class WavePlan(NamedTuple):
    """One wave of one layer, planned (state already updated).

    `slot_ids` [T, K] int32: each pair's slot after the wave, -1 = not in this wave;
    `hits` [E] bool: the wave's experts that were resident before it;
    `misses` [2, M] int32: row 0 the missed experts in routed order, row 1 their slots,
    -1 after the last (M = min(T·K, E, S)); `overflow` []: more misses than unprotected
    slots (never inside `layer_waves`: the misses past it got no slot, -1)."""

    slot_ids: torch.Tensor
    hits: torch.Tensor
    misses: torch.Tensor
    overflow: torch.Tensor

    def hit_pairs(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """[T, K] bool: the pairs of `topk_ids` (this wave's routing) served by a hit."""
        return self.hits[topk_ids.clamp(min=0).long()] & (topk_ids >= 0)


class _Order(NamedTuple):
    """A wave's routed experts against the current state ([E] unless noted)."""

    experts: torch.Tensor  # [N] expert id of each pair, -1 = not routed
    routed: torch.Tensor  # bool
    hit: torch.Tensor  # bool: routed and resident
    miss: torch.Tensor  # bool: routed and not resident
    slot_before: torch.Tensor  # int64 slot before the wave, -1 = not resident
    rank: torch.Tensor  # int64 position in (hits, misses) routed order; routed ones first
    order: torch.Tensor  # int64 expert at each position
    num_hits: torch.Tensor  # [] int64


class DeviceSlotCache:
    """A pool of `num_slots` slots shared by `num_layers` layers of `num_experts` experts.

    State (device tensors, updated in place, same objects for the cache's life):
    `slot_map` [L, E] int32 (-1 = not resident), `slot_owners` [S] int64 (layer·E + expert,
    -1 = free), `recency` [S] int64 (meaningful for owned slots), `wave_end` [L] int64 (the
    clock after each layer's last wave that routed anything), and counters read lazily:
    `counts` [L, 2] int64 (hits, misses: distinct experts per wave, cumulative) and
    `events` [L, E] uint8 (the strongest of HIT / MISS since the last `take_events`, while
    `mark_events`).
    `policy`: "lru" (scan-resistant) or "lru-plain" (`DEVICE_POLICIES`).
    `fused`: plan each wave with the fused kernel (default: on CUDA when supported) or
    the torch ops (False; True on CPU runs the kernel under Triton's interpreter: tests).
    Locking: none; one thread issues the ops, the stream orders them.
    """

    def __init__(
        self, num_slots: int, num_layers: int, num_experts: int, device: torch.device, fused: bool | None = None,
        policy: str = "lru",
    ) -> None:
        if num_slots < 1 or num_layers < 1 or num_experts < 1:
            raise ValueError(f"need positive sizes, got {num_slots=} {num_layers=} {num_experts=}")
        if policy not in DEVICE_POLICIES:
            raise ValueError(f"the device cache evicts by {' or '.join(DEVICE_POLICIES)}, not {policy!r}")
        self.policy, self.scan = policy, policy == "lru"
        S, L, E = num_slots, num_layers, num_experts
        self.num_slots, self.num_layers, self.num_experts, self.device = S, L, E, device
        # One trailing "trash" entry each: masked scatters write there (shape-static, no nonzero()).
        self._map = torch.full((L * E + 1,), -1, dtype=torch.int32, device=device)
        self._owners = torch.full((S + 1,), -1, dtype=torch.int64, device=device)
        self._recency = torch.zeros(S + 1, dtype=torch.int64, device=device)
        self.slot_map = self._map[: L * E].view(L, E)
        self.slot_owners, self.recency = self._owners[:S], self._recency[:S]
        self.clock = torch.zeros((), dtype=torch.int64, device=device)  # next recency value
        self.wave_end = torch.zeros(L, dtype=torch.int64, device=device)
        self.counts = torch.zeros(L, 2, dtype=torch.int64, device=device)
        self.events = torch.zeros(L, E, dtype=torch.uint8, device=device)
        self.mark_events = True  # off: the plan skips the live view's marks (a few ops per wave)
        self._slot_idx = torch.arange(S, device=device)
        self._expert_idx = torch.arange(E, device=device)
        self.fused = fused_plan_supported(device, S, E) if fused is None else fused
        self.state = SlotState(self.slot_map, self.slot_owners, self.recency, self.clock, self.counts, self.events,
                               self.wave_end)

    # ---- the per-layer plan ------------------------------------------------------

    def num_waves(self, num_pairs: int, num_pinned: int = 0) -> int:
        """Waves a layer of `num_pairs` routed pairs runs in (static: from shapes only)."""
        capacity = self.num_slots - num_pinned
        if capacity < 1:
            raise RuntimeError(f"all {self.num_slots} slots are pinned")
        return max(1, math.ceil(min(num_pairs, self.num_experts) / capacity))

    def layer_waves(
        self, layer: int, topk_ids: torch.Tensor, pinned: torch.Tensor | None = None, num_pinned: int = 0,
        dead: torch.Tensor | None = None,
    ) -> Iterator[WavePlan]:
        """Plan `layer` for `topk_ids` [T, K] (-1 = not routed), wave by wave. Each plan is
        made when the previous wave has been consumed (its copies and compute issued),
        so wave w+1's updates follow wave w's work in stream order.

        `pinned` [S] bool: slots no wave may evict (another layer's unreleased plan), and
        `num_pinned` their number, known on the host (it sizes the waves). `dead` [T] bool:
        rows that route nothing (a padded batch's), as if their ids were -1 — the fused
        plan drops them itself, with no launch of its own on the decode chain."""
        waves = self.num_waves(topk_ids.numel(), num_pinned)
        if waves == 1:
            yield self.plan_wave(layer, topk_ids, pinned, dead=dead)
            return
        if dead is not None:
            topk_ids = topk_ids.masked_fill(dead[:, None], -1)
        capacity = self.num_slots - num_pinned
        first = self._order(layer, topk_ids)
        wave_of = (first.rank // capacity)[first.experts.clamp(min=0)]  # [N] the wave of each pair
        ids = first.experts.view(topk_ids.shape)
        for w in range(waves):
            yield self.plan_wave(layer, torch.where(wave_of.view(ids.shape) == w, ids, -1), pinned)

    def plan_wave(
        self, layer: int, topk_ids: torch.Tensor, pinned: torch.Tensor | None = None, ahead: bool = False,
        dead: torch.Tensor | None = None,
    ) -> WavePlan:
        """One wave: every routed expert of `topk_ids` gets a slot if capacity allows.

        `ahead`: a plan made ahead of the layer's own (decode prefetch, `moe/prefetch.py`):
        the same decisions and updates, but its hits are not counted (no use yet) and the
        layer's cycle (`wave_end`, which the scan-resistant policy dates by real waves)
        doesn't advance; its misses count (they are copied). `dead` [T] bool: rows that route
        nothing (`layer_waves`)."""
        if self.fused:
            out = plan_wave_fused(self.state, layer, topk_ids, pinned, self.mark_events, (HIT, MISS), self.scan,
                                  ahead, dead)
            return WavePlan(out.slot_ids.view(topk_ids.shape), out.hits, out.misses, out.overflow)
        if dead is not None:
            topk_ids = topk_ids.masked_fill(dead[:, None], -1)
        S, E = self.num_slots, self.num_experts
        o = self._order(layer, topk_ids)
        stamp = self.clock + o.rank  # [E] recency of each use, in (hits, misses) order
        self._recency.index_put_((torch.where(o.hit, o.slot_before, S),), stamp)
        cand, num_free = self._candidates(layer, o.routed, pinned)
        j = o.rank - o.num_hits  # [E] index among the misses
        take = o.miss & (j < num_free)
        new_slot = cand[j.clamp(0, S - 1)]  # [E]
        evicted = self._owners[new_slot]  # [E] key losing its slot, -1 = the slot was free
        keys = layer * E + self._expert_idx
        trash_map, trash_slot = self._map.numel() - 1, S
        self._map.index_fill_(0, torch.where(take & (evicted >= 0), evicted, trash_map), -1)
        self._map.index_put_((torch.where(take, keys, trash_map),), new_slot.to(torch.int32))
        self._owners.index_put_((torch.where(take, new_slot, trash_slot),), keys)
        self._recency.index_put_((torch.where(take, new_slot, trash_slot),), stamp)
        num_taken = take.sum()
        self.clock.add_(o.num_hits + num_taken)
        if ahead:
            self.counts[layer, 1].add_(num_taken)
        else:  # an empty wave (padding, a static trailing wave) is no wave of the layer's cycle
            self.wave_end[layer].copy_(torch.where(o.routed.any(), self.clock, self.wave_end[layer]))
            self.counts[layer].add_(torch.stack((o.num_hits, num_taken)))
        if self.mark_events:
            code = torch.where(o.hit, HIT, torch.where(take, MISS, 0)).to(torch.uint8)
            torch.maximum(self.events[layer], code, out=self.events[layer])
        return WavePlan(
            slot_ids=self._pair_slots(layer, o.experts).view(topk_ids.shape),
            hits=o.hit,
            misses=self._miss_list(o, cand, num_taken, topk_ids.numel()),
            overflow=(o.miss.sum() > num_taken),
        )

    # ---- internals ----------------------------------------------------------------

    def _order(self, layer: int, topk_ids: torch.Tensor) -> _Order:
        """Routed experts in (hits, misses) routed order, against the current map."""
        flat = topk_ids.reshape(-1).long()
        E, e = self.num_experts, self._expert_idx
        pairs = torch.zeros(E, dtype=torch.int64, device=flat.device)
        routed = pairs.index_add_(0, flat.clamp(min=0), (flat >= 0).long()) > 0  # integer adds: exact
        slot_before = self.slot_map[layer].long()  # a copy: the map changes below
        hit, miss = routed & (slot_before >= 0), routed & (slot_before < 0)
        # Distinct keys: hits by id, then misses by id, then the rest.
        key = torch.where(hit, e, torch.where(miss, e + E, e + 2 * E))
        order = torch.argsort(key)
        rank = torch.empty_like(order).scatter_(0, order, e)
        return _Order(flat, routed, hit, miss, slot_before, rank, order, hit.sum())

    def _candidates(self, layer: int, routed: torch.Tensor, pinned: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots in the order misses take them [S], how many may be taken [])."""
        S, E = self.num_slots, self.num_experts
        owner = self.slot_owners
        free = owner < 0
        protected = ~free & (owner.div(E, rounding_mode="floor") == layer) & routed[owner.remainder(E)]
        if pinned is not None:
            protected = protected | pinned
        order = self.recency
        if self.scan:  # read before this wave's update of wave_end
            order = torch.where(order < self.wave_end[layer], order, FRESH - order)
        key = torch.where(free, self._slot_idx - S, order).masked_fill(protected, NEVER)
        return torch.argsort(key), S - protected.sum()

    def _pair_slots(self, layer: int, experts: torch.Tensor) -> torch.Tensor:
        """[N] int32: each pair's slot after the wave (-1 for pairs not routed)."""
        E = self.num_experts
        slots = self._map[layer * E + experts.clamp(min=0)]
        return torch.where(experts >= 0, slots, -1)

    def _miss_list(self, o: _Order, cand: torch.Tensor, num_taken: torch.Tensor, num_pairs: int) -> torch.Tensor:
        """[2, M] int32: (expert, slot) of each miss given a slot, in routed order; -1 after."""
        S, E = self.num_slots, self.num_experts
        m = torch.arange(min(num_pairs, E, S), device=cand.device)
        valid = m < num_taken
        experts = o.order[(o.num_hits + m).clamp(max=E - 1)]
        out = torch.stack((experts, cand[m]))
        return torch.where(valid, out, -1).to(torch.int32)

    # ---- whole-cache operations (not on the hot path) ---------------------------------

    def clear(self) -> None:
        """Empty the pool (after a failed step: slot contents are unknown). Counters stay."""
        self._map.fill_(-1)
        self._owners.fill_(-1)

    def lend(self, n: int, below: int | None = None) -> torch.Tensor:
        """Empty `n` slots for a streamed prefill's buffers (`moe/prefill_stream.py`): free
        slots first (by index), then the least recent, among the slots below `below` (all
        by default: the rest may be lent elsewhere); their experts leave the map. Returns
        their ids [n] int64 on the device. They stay free: the next misses take them."""
        S = self.num_slots if below is None else below
        if not 0 < n <= S <= self.num_slots:
            raise ValueError(f"cannot lend {n} of {S} slots")
        key = torch.where(self.slot_owners[:S] < 0, self._slot_idx[:S] - S, self.recency[:S])
        lent = torch.argsort(key)[:n]
        self._evict(lent)
        return lent

    def evict_from(self, first: int) -> None:
        """Empty the slots from `first` on (their memory lent: `moe/slot_lending.py`); they
        are free afterwards, and nothing may plan before they are given back."""
        if not 0 <= first <= self.num_slots:
            raise ValueError(f"no slot {first} in a pool of {self.num_slots}")
        self._evict(self._slot_idx[first:])

    def _evict(self, slots: torch.Tensor) -> None:
        """`slots` [n] int64 free, their experts out of the map."""
        owners = self._owners[slots]
        self._map.index_fill_(0, torch.where(owners >= 0, owners, self._map.numel() - 1), -1)
        self._owners.index_fill_(0, slots, -1)

    def read_counts(self) -> np.ndarray:
        """[L, 2] (hits, misses) since construction: one device read."""
        return self.counts.to("cpu", copy=True).numpy()  # a copy on a CPU device too

    def take_events(self) -> np.ndarray:
        """[L, E] uint8 activity codes since the last take (one read), then cleared."""
        out = self.events.to("cpu", copy=True).numpy()
        with torch.inference_mode():  # inside or outside a forward alike
            self.events.zero_()
        return out

    def lru_order(self) -> list[int]:
        """Resident keys (layer·E + expert), least recently used first (tests, tools; the
        "lru" policy's victims follow it only among stale keys)."""
        owners, recency = self.slot_owners.cpu(), self.recency.cpu()
        owned = owners >= 0
        return owners[owned][torch.argsort(recency[owned])].tolist()
