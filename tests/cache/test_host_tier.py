"""The host tier against a plain reference model (an LRU dict with lock counts), driven by
hypothesis: what it holds after every store, that a locked key is never evicted, that a
load brings back exactly what was stored under that key, and that no slot is leaked or
held twice. Plus the refusals at start."""

from __future__ import annotations

from collections import Counter, OrderedDict

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from edgemoe.cache.host_tier import HostTier, TierError, chain_digest
from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.state_pool import StatePool, StateShape

PAGES, PS = 6, 2
SHAPE = StateShape(num_layers=2, num_v_heads=1, key_dim=2, value_dim=2, conv_channels=3, conv_history=2,
                   conv_dtype=torch.float32)
KEYS = st.integers(0, 7).map(lambda i: chain_digest(bytes(16), [i]))


class RefTier:
    """One entry kind: key -> stored value, least recently used first; lock counts."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.held, self.locks = capacity, OrderedDict[bytes, float](), Counter[bytes]()

    def store(self, items: list[tuple[bytes, float]]) -> int:
        new = []
        for key, value in items:  # keys already held are touched first, in order
            if key in self.held:
                self.held.move_to_end(key)
            else:
                new.append((key, value))
        count = len(items) - len(new)
        for key, value in new:
            if len(self.held) == self.capacity:
                victim = next((k for k in self.held if not self.locks[k]), None)
                if victim is None:
                    break
                del self.held[victim]
            self.held[key] = value
            count += 1
        return count


class HostTierMachine(RuleBasedStateMachine):
    @initialize(page_slots=st.integers(1, 4), snapshot_slots=st.integers(1, 3))
    def setup(self, page_slots: int, snapshot_slots: int) -> None:
        self.kv = KVPool(2, PAGES, PS, 1, 2, torch.float32, torch.device("cpu"))
        self.states = StatePool(SHAPE, live_rows=2, snapshot_rows=0, device=torch.device("cpu"))
        self.tier = HostTier(self.kv, page_slots, self.states, snapshot_slots)
        self.pages, self.snaps = RefTier(page_slots), RefTier(snapshot_slots)
        self.version = 0.0

    def _fresh(self) -> float:
        self.version += 1.0
        return self.version

    @rule(keys=st.lists(KEYS, min_size=1, max_size=PAGES, unique=True))
    def store_pages(self, keys: list[bytes]) -> None:
        values = [self._fresh() for _ in keys]
        for page, value in enumerate(values):  # page `page` holds `value` in every entry
            self.kv.k[:, page * PS : (page + 1) * PS] = value
            self.kv.v[:, page * PS : (page + 1) * PS] = -value
        locked = {k for k in self.tier._pages.of if self.pages.locks[k]}
        held = self.tier.store_pages(keys, list(range(len(keys))))
        assert held == self.pages.store(list(zip(keys, values, strict=True)))
        assert locked <= set(self.tier._pages.of)  # making room never evicts a locked entry

    @rule(data=st.data())
    def load_pages(self, data: st.DataObject) -> None:
        if not self.pages.held:
            return
        keys = data.draw(st.lists(st.sampled_from(list(self.pages.held)), min_size=1, max_size=PAGES, unique=True))
        targets = data.draw(st.permutations(range(PAGES)))[: len(keys)]
        self.kv.k.fill_(float("nan"))
        self.tier.load_pages(keys, targets)
        for key, page in zip(keys, targets, strict=True):
            self.pages.held.move_to_end(key)
            want = self.pages.held[key]
            assert (self.kv.k[:, page * PS : (page + 1) * PS] == want).all()  # the entry asked for
            assert (self.kv.v[:, page * PS : (page + 1) * PS] == -want).all()

    @rule(key=KEYS)
    def store_snapshot(self, key: bytes) -> None:
        value = self._fresh()
        self.states.recurrent[:, 1], self.states.conv[:, 1] = value, -value
        locked = {k for k in self.tier._snaps.of if self.snaps.locks[k]}
        stored = self.tier.store_snapshot(key, 1)
        assert stored == bool(self.snaps.store([(key, value)]))
        assert locked <= set(self.tier._snaps.of)

    @rule(data=st.data())
    def load_snapshot(self, data: st.DataObject) -> None:
        if not self.snaps.held:
            return
        key = data.draw(st.sampled_from(list(self.snaps.held)))
        self.states.recurrent[:, 0], self.states.conv[:, 0] = float("nan"), float("nan")
        self.tier.load_snapshot(key, 0)
        self.snaps.held.move_to_end(key)
        want = self.snaps.held[key]
        assert (self.states.recurrent[:, 0] == want).all() and (self.states.conv[:, 0] == -want).all()

    @rule(key=KEYS)
    def lock(self, key: bytes) -> None:
        self.tier.lock([key])
        self.pages.locks[key] += 1
        self.snaps.locks[key] += 1

    @precondition(lambda self: +self.pages.locks)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(+self.pages.locks)))
        self.tier.unlock([key])
        self.pages.locks[key] -= 1
        self.snaps.locks[key] -= 1

    @invariant()
    def same_entries_and_no_slot_leaked_or_shared(self) -> None:
        if not hasattr(self, "tier"):
            return
        for slots, ref in ((self.tier._pages, self.pages), (self.tier._snaps, self.snaps)):
            assert list(slots.of) == list(ref.held)  # same keys, same LRU order
            used = list(slots.of.values())
            assert len(set(used)) == len(used) and not set(used) & set(slots.free)
            assert sorted(used + slots.free) == list(range(slots.count))


TestHostTier = HostTierMachine.TestCase
TestHostTier.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_locked_entries_survive_a_full_tier() -> None:
    kv = KVPool(1, 4, PS, 1, 2, torch.float32, torch.device("cpu"))
    tier = HostTier(kv, 2)
    keys = [chain_digest(bytes(16), [i]) for i in range(4)]
    assert tier.store_pages(keys[:2], [0, 1]) == 2
    tier.lock(keys[:2])
    assert tier.store_pages(keys[2:], [2, 3]) == 0  # every slot locked: nothing evicted
    assert tier.has_page(keys[0]) and tier.has_page(keys[1])
    tier.unlock([keys[0]])
    assert tier.store_pages(keys[2:3], [2]) == 1 and not tier.has_page(keys[0]) and tier.has_page(keys[1])


def test_a_pool_without_page_io_is_refused() -> None:
    class OpaquePool:  # a KV layout the tier cannot copy pages out of and back into
        page_size = PS
        k = torch.zeros(1, 4, 1, 2)

    with pytest.raises(TierError, match="--host-cache.*cannot be restored"):
        HostTier(OpaquePool(), 2)  # type: ignore[arg-type]


def test_pages_carry_fp8_scales_and_index_keys_through_the_tier() -> None:
    """Every per-slot tensor of the pool goes to the host and back bit for bit: fp8 K/V
    (`--kv-cache-dtype fp8`), their scales, and a QSA model's index keys."""
    kv = KVPool(2, PAGES, PS, 1, 4, torch.float32, torch.device("cpu"), "fp8", index_dim=3)
    assert len(kv.slot_tensors) == 5 and kv.index_k is not None and kv.k_scale is not None
    g = torch.Generator().manual_seed(0)
    for t in kv.slot_tensors:
        t.view(torch.uint8).copy_(torch.randint(0, 120, t.view(torch.uint8).shape, generator=g, dtype=torch.uint8))
    before = [t.clone() for t in kv.slot_tensors]
    tier = HostTier(kv, 3)
    keys = [chain_digest(bytes(16), [i]) for i in range(2)]
    assert tier.store_pages(keys, [1, 4]) == 2
    tier.load_pages(keys, [0, 5])
    for t, old in zip(kv.slot_tensors, before, strict=True):
        bits, old_bits = t.view(torch.uint8), old.view(torch.uint8)
        assert torch.equal(bits[:, 0:PS], old_bits[:, PS : 2 * PS])
        assert torch.equal(bits[:, 5 * PS : 6 * PS], old_bits[:, 4 * PS : 5 * PS])
