"""Eviction policies against naive reference models (timestamps, counts, full sorts)."""

from __future__ import annotations

import random
from collections.abc import Collection

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from edgemoe.moe.policy import (
    EvictionPolicy,
    LFUPolicy,
    LRUPolicy,
    ScanLRUPolicy,
    available_policies,
    make_policy,
)


class RefPolicy:
    """The policies the slow, obvious way: every key carries (count, last use time);
    a victim is found by sorting all unprotected keys.

    "lru-plain" ranks by last use. "lru" (scan-resistant): a key is stale if its last use
    came no later than the end of the previous wave of the layer now being planned (the
    number of uses made by then; 0 if that layer never had a wave); stale keys rank first,
    oldest first, then the others, newest first. LFU ranks by (count, last use), keeps a
    ghost count for removed keys, and after any use halves every count (resident and
    ghost) when the mean resident count reaches `max_average`.
    """

    def __init__(self, kind: str, max_average: int = 16) -> None:
        self.kind, self.max_average = kind, max_average
        self.time = 0  # uses so far; a use's time is its 1-based index
        self.last: dict[int, int] = {}
        self.count: dict[int, int] = {}
        self.ghost: dict[int, int] = {}
        self.wave_end: dict[int, int] = {}  # layer -> uses made when its last wave ended
        self.stale_until = 0  # uses at the end of the planned layer's previous wave

    def insert(self, key: int) -> None:
        if key in self.last:
            raise ValueError(key)
        self.count[key] = self.ghost.pop(key, 0) if self.kind == "lfu" else 0
        self._use(key)

    def touch(self, key: int) -> None:
        if key not in self.last:
            raise KeyError(key)
        self._use(key)

    def remove(self, key: int) -> None:
        if key not in self.last:
            raise KeyError(key)
        del self.last[key]
        self.ghost[key] = self.count.pop(key)

    def victims(self, protected: Collection[int], n: int) -> list[int]:
        candidates = sorted((k for k in self.last if k not in protected), key=self.rank)
        if len(candidates) < n:
            raise LookupError(n)
        return candidates[:n]

    def begin_wave(self, layer: int) -> None:
        self.stale_until = self.wave_end.get(layer, 0)

    def end_wave(self, layer: int) -> None:
        self.wave_end[layer] = self.time

    def rank(self, key: int) -> tuple[int, int]:
        if self.kind == "lfu":
            return (self.count[key], self.last[key])
        if self.kind == "lru" and self.last[key] > self.stale_until:
            return (1, -self.last[key])  # fresh: after every stale key, newest first
        return (0, self.last[key])

    def _use(self, key: int) -> None:
        self.time += 1
        self.last[key] = self.time
        self.count[key] += 1
        if self.kind == "lfu" and sum(self.count.values()) >= self.max_average * len(self.count):
            self.count = {k: c // 2 for k, c in self.count.items()}
            self.ghost = {k: c // 2 for k, c in self.ghost.items()}


def _same_outcome(real_call, ref_call):  # type: ignore[no-untyped-def]
    """Run both; they must return equal values or raise the same exception type."""
    try:
        expected = ref_call()
    except (KeyError, ValueError, LookupError) as exc:
        with pytest.raises(type(exc)):
            real_call()
        return None
    got = real_call()
    assert got == expected
    return got


KEYS = st.integers(0, 23)


class PolicyMachine(RuleBasedStateMachine):
    """Random insert/touch/remove/victims sequences, real policy beside the reference."""

    @initialize(kind=st.sampled_from(["lru", "lru-plain", "lfu"]), max_average=st.integers(1, 6))
    def setup(self, kind: str, max_average: int) -> None:
        self.real: EvictionPolicy = make_policy(kind, **({"max_average": max_average} if kind == "lfu" else {}))
        self.ref = RefPolicy(kind, max_average)

    @rule(key=KEYS)
    def insert(self, key: int) -> None:
        _same_outcome(lambda: self.real.insert(key), lambda: self.ref.insert(key))

    def _some_key(self) -> st.SearchStrategy[int]:
        # Mostly resident keys (the useful case), sometimes any key (the misuse case).
        return st.sampled_from(sorted(self.ref.last)) | KEYS if self.ref.last else KEYS

    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        key = data.draw(self._some_key())
        _same_outcome(lambda: self.real.touch(key), lambda: self.ref.touch(key))

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(self._some_key())
        _same_outcome(lambda: self.real.remove(key), lambda: self.ref.remove(key))

    @rule(layer=st.integers(0, 3))
    def begin_wave(self, layer: int) -> None:
        self.real.begin_wave(layer)
        self.ref.begin_wave(layer)

    @rule(layer=st.integers(0, 3))
    def end_wave(self, layer: int) -> None:
        self.real.end_wave(layer)
        self.ref.end_wave(layer)

    @rule(protected=st.frozensets(KEYS, max_size=8), n=st.integers(0, 6))
    def victims(self, protected: frozenset[int], n: int) -> None:
        _same_outcome(lambda: self.real.victims(protected, n), lambda: self.ref.victims(protected, n))

    @invariant()
    def same_keys(self) -> None:
        if hasattr(self, "real"):
            assert set(self.real.keys()) == set(self.ref.last)
            assert len(self.real) == len(self.ref.last)
            assert all(k in self.real for k in self.ref.last)


TestPolicyMachine = PolicyMachine.TestCase
TestPolicyMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@pytest.mark.parametrize("kind,max_average", [("lru", 16), ("lru-plain", 16), ("lfu", 16), ("lfu", 2), ("lfu", 1)])
def test_long_random_sequence_matches_reference(kind: str, max_average: int) -> None:
    # Long runs reach what short hypothesis runs rarely do: many halvings, heap rebuilds.
    rng = random.Random(1234)
    real = make_policy(kind, **({"max_average": max_average} if kind == "lfu" else {}))
    ref = RefPolicy(kind, max_average)
    universe, capacity = range(60), 24
    weights = [1.0 / (1 + k) for k in universe]  # skewed, so LFU counts diverge from recency
    for i in range(20_000):
        if i % 3 == 0:  # a wave of one of 4 layers every 3 uses: stale and fresh keys both occur
            for p in (real, ref):
                p.end_wave((i // 3 - 1) % 4)
                p.begin_wave((i // 3) % 4)
        key = rng.choices(universe, weights)[0]
        if key in ref.last:
            real.touch(key)
            ref.touch(key)
        else:
            if len(ref.last) >= capacity:
                protected = set(rng.sample(sorted(ref.last), 3))
                victim = ref.victims(protected, 1)[0]
                assert real.victim(protected) == victim
                real.remove(victim)
                ref.remove(victim)
            real.insert(key)
            ref.insert(key)
    assert set(real.keys()) == set(ref.last)


def test_lru_evicts_least_recent_first() -> None:
    p = LRUPolicy()
    for k in (1, 2, 3, 4):
        p.insert(k)
    p.touch(1)
    assert p.victims((), 4) == [2, 3, 4, 1]
    assert p.victims({2, 3}, 2) == [4, 1]


def test_scan_lru_evicts_stale_oldest_first_then_the_newest() -> None:
    p = ScanLRUPolicy()
    p.begin_wave(0)
    for k in (1, 2):  # layer 0's wave: stamps 0, 1
        p.insert(k)
    p.end_wave(0)  # layer 0 ended at clock 2
    p.begin_wave(1)
    for k in (3, 4):  # layer 1's wave: stamps 2, 3
        p.insert(k)
    p.end_wave(1)
    p.begin_wave(0)  # layer 0 again: keys used before clock 2 (its own last wave) are stale
    p.touch(1)  # a hit, stamp 4 (and protected by the cache)
    assert p.victims({1}, 3) == [2, 4, 3]  # stale 2; then the fresh ones, newest first
    assert p.stamp(2) == 1 and p.stamp(1) == 4 and p.wave_end(0) == 2 and p.wave_end(5) == 0
    p.end_wave(0)
    p.begin_wave(1)  # layer 1 ended at clock 4: keys 3 and 4 (stamps 2, 3) are stale
    assert p.victims((), 4) == [2, 3, 4, 1]  # every key stale but 1 (stamp 4): plain LRU order
    assert p.clock == 5


def test_scan_lru_without_waves_keeps_the_oldest() -> None:
    """Before any wave every key is fresh (no layer has a previous wave): newest first."""
    p = make_policy("lru")
    for k in (1, 2, 3):
        p.insert(k)
    assert p.victims((), 3) == [3, 2, 1]


def test_lfu_keeps_a_hot_key_through_a_scan() -> None:
    p = LFUPolicy()
    p.insert(0)
    for _ in range(5):
        p.touch(0)
    for k in range(1, 40):  # a scan, as a long prefill chunk would do
        if len(p) == 4:
            p.remove(p.victim({k}))
        p.insert(k)
    assert 0 in p


def test_lfu_ties_go_to_least_recent() -> None:
    p = LFUPolicy()
    for k in (5, 6, 7):
        p.insert(k)
    assert p.victims((), 3) == [5, 6, 7]
    p.touch(5)  # count 2 now: the others, equal at 1, go first, oldest first
    assert p.victims((), 3) == [6, 7, 5]


def test_lfu_remembers_counts_across_eviction() -> None:
    p = LFUPolicy()
    p.insert(1)
    for _ in range(3):
        p.touch(1)
    p.remove(1)
    assert 1 not in p and p.count(1) == 4
    p.insert(2)
    p.insert(1)
    assert p.count(1) == 5
    assert p.victim(()) == 2


def test_lfu_ageing_lets_a_cooled_key_go() -> None:
    p = LFUPolicy(max_average=4)
    p.insert(0)
    p.insert(1)
    for _ in range(50):
        p.touch(0)  # 0 is hot early ...
    assert p.victim(()) == 1
    for _ in range(50):
        p.touch(1)  # ... then only 1 is used: halvings shrink 0's lead away
    assert p.victim(()) == 0
    assert p.count(0) <= 8 and p.count(1) <= 8  # counts stay bounded by the ageing


@pytest.mark.parametrize("name", ["lru", "lru-plain", "lfu"])
def test_misuse_raises(name: str) -> None:
    p = make_policy(name)
    p.insert(1)
    with pytest.raises(ValueError):
        p.insert(1)
    with pytest.raises(KeyError):
        p.touch(2)
    with pytest.raises(KeyError):
        p.remove(2)
    with pytest.raises(LookupError):
        p.victim({1})
    with pytest.raises(LookupError):
        p.victims((), 2)
    assert p.victims((), 0) == []


def test_registry() -> None:
    assert set(available_policies()) == {"lru", "lru-plain", "lfu"}
    assert isinstance(make_policy("lru"), ScanLRUPolicy)
    assert type(make_policy("lru-plain")) is LRUPolicy
    assert isinstance(make_policy("LFU"), LFUPolicy)
    assert make_policy("lfu", max_average=3).max_average == 3  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")
    with pytest.raises(ValueError):
        LFUPolicy(max_average=0)
