"""SlotCache against a plain reference model of the pool, plus spec properties of waves."""

from __future__ import annotations

import math
import random

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

from edgemoe.moe.policy import LFUPolicy, LRUPolicy, ScanLRUPolicy, make_policy
from edgemoe.moe.slots import LayerWave, SlotCache

Pair = tuple[int, int]  # (layer, expert)
PlainWave = tuple[tuple[int, ...], tuple[int, ...], int, tuple[tuple[int, int, Pair | None], ...]]


class RefCache:
    """The pool as a dict and a list, with the policy inlined as explicit per-key
    (count, last-use time) and a full sort to find victims. Written from the
    SlotCache contract, not its code: per wave, touch hits in order, pick all
    victims, then give each miss the lowest free slot or the next victim's slot.

    "lru" (scan-resistant), brute force: a key is stale if its last use came no later
    than the end of the previous wave of the layer being planned (0 uses if none);
    victims are the stale keys oldest first, then the rest newest first."""

    def __init__(self, num_slots: int, kind: str, max_average: int = 16) -> None:
        self.num_slots, self.kind, self.max_average = num_slots, kind, max_average
        self.slot_of: dict[Pair, int] = {}
        self.owner: list[Pair | None] = [None] * num_slots
        self.pinned: dict[int, set[Pair]] = {}
        self.time = 0
        self.last: dict[Pair, int] = {}
        self.count: dict[Pair, int] = {}
        self.ghost: dict[Pair, int] = {}
        self.wave_end: dict[int, int] = {}  # layer -> uses made when its last wave ended
        self.hits = self.misses = 0

    def plan(self, layer: int, experts: list[int]) -> list[PlainWave]:
        if layer in self.pinned:
            raise RuntimeError("pinned")
        routed = []
        for e in experts:
            if e not in routed:
                routed.append(e)
        routed = [e for e in routed if (layer, e) in self.slot_of] + [
            e for e in routed if (layer, e) not in self.slot_of
        ]
        others = set().union(*self.pinned.values())
        size = self.num_slots - len(others)
        if routed and size < 1:
            raise RuntimeError("no capacity")
        waves = [self._wave(layer, routed[i : i + size], others) for i in range(0, len(routed), max(size, 1))]
        self.pinned[layer] = {(layer, e) for e in routed if (layer, e) in self.slot_of}
        return waves

    def _wave(self, layer: int, chunk: list[int], others: set[Pair]) -> PlainWave:
        protected = others | {(layer, e) for e in chunk}
        hits = [e for e in chunk if (layer, e) in self.slot_of]
        misses = [e for e in chunk if (layer, e) not in self.slot_of]
        stale_until = self.wave_end.get(layer, 0)
        for e in hits:
            self._use((layer, e))
        free = sorted(s for s in range(self.num_slots) if self.owner[s] is None)[: len(misses)]
        candidates = sorted((k for k in self.slot_of if k not in protected), key=lambda k: self._rank(k, stale_until))
        victims = candidates[: len(misses) - len(free)]
        loads = []
        for i, e in enumerate(misses):
            evicted = None
            if i < len(free):
                slot = free[i]
            else:
                evicted = victims[i - len(free)]
                slot = self.slot_of.pop(evicted)
                del self.last[evicted]
                self.ghost[evicted] = self.count.pop(evicted)
            self.slot_of[(layer, e)] = slot
            self.owner[slot] = (layer, e)
            self.count[(layer, e)] = self.ghost.pop((layer, e), 0) if self.kind == "lfu" else 0
            self._use((layer, e))
            loads.append((e, slot, evicted))
        self.wave_end[layer] = self.time
        self.hits += len(hits)
        self.misses += len(misses)
        slots = tuple(self.slot_of[(layer, e)] for e in hits) + tuple(s for _, s, _ in loads)
        return tuple(hits + misses), slots, len(hits), tuple(loads)

    def release(self, layer: int) -> None:
        del self.pinned[layer]

    def _rank(self, key: Pair, stale_until: int) -> tuple[int, int]:
        if self.kind == "lfu":
            return (self.count[key], self.last[key])
        if self.kind == "lru" and self.last[key] > stale_until:
            return (1, -self.last[key])  # used since the layer's previous wave: newest first
        return (0, self.last[key])

    def _use(self, key: Pair) -> None:
        self.time += 1
        self.last[key] = self.time
        self.count[key] += 1
        if self.kind == "lfu" and sum(self.count.values()) >= self.max_average * len(self.count):
            self.count = {k: c // 2 for k, c in self.count.items()}
            self.ghost = {k: c // 2 for k, c in self.ghost.items()}


def plain(wave: LayerWave) -> PlainWave:
    misses = tuple((m.expert, m.slot, None if m.evicted is None else tuple(m.evicted)) for m in wave.misses)
    return wave.experts, wave.slots, wave.num_hits, misses  # type: ignore[return-value]


def make_pair(
    num_slots: int, layers: int, experts: int, kind: str, max_average: int = 16
) -> tuple[SlotCache, RefCache]:
    policy = {"lru": ScanLRUPolicy, "lru-plain": LRUPolicy}.get(kind, lambda: LFUPolicy(max_average))()
    return SlotCache(num_slots, layers, experts, policy), RefCache(num_slots, kind, max_average)


def assert_same_state(cache: SlotCache, ref: RefCache) -> None:
    cache.check_invariants()
    expected = torch.full_like(cache.slot_map, -1)
    for (layer, expert), slot in ref.slot_of.items():
        expected[layer, expert] = slot
    assert torch.equal(cache.slot_map, expected)
    assert [cache.owner(s) for s in range(cache.num_slots)] == ref.owner
    assert cache.stats.total_hits == ref.hits and cache.stats.total_misses == ref.misses


def resident_slots(cache: SlotCache, layer: int) -> dict[int, int]:
    return {e: s for e in range(cache.num_experts) if (s := cache.lookup(layer, e)) is not None}


def check_wave_spec(
    cache: SlotCache,
    layer: int,
    routed: list[int],
    before: dict[int, int],
    waves: list[LayerWave],
    capacity: int,
) -> None:
    """Properties from the contract alone, no reference model needed. `before` is the
    layer's expert -> slot map before planning, `capacity` the free capacity then."""
    unique = list(dict.fromkeys(routed))
    covered = [e for w in waves for e in w.experts]
    assert sorted(covered) == sorted(unique), "each routed expert in exactly one wave"
    assert len(waves) == math.ceil(len(unique) / capacity) if unique else waves == []
    seen_miss = False
    for w in waves:
        assert w.layer == layer and 0 < len(w.experts) <= capacity
        assert len(set(w.slots)) == len(w.slots), "two experts of a wave share a slot"
        assert w.hits == tuple(e for e in w.experts if e in before)
        assert all(before[e] == s for e, s in zip(w.hits, w.slots)), "a hit moved before it ran"
        assert not (seen_miss and w.num_hits), "hits come before any load"
        seen_miss = seen_miss or bool(w.misses)
        assert [m.expert for m in w.misses] == list(w.experts[w.num_hits :])
        assert [m.slot for m in w.misses] == list(w.slots[w.num_hits :])
        for m in w.misses:
            assert m.evicted is None or m.evicted not in {(layer, e) for e in w.experts}
    for e, s in zip(waves[-1].experts if waves else (), waves[-1].slots if waves else ()):
        assert cache.lookup(layer, e) == s, "the last wave is resident when plan_layer returns"


def drive(cache: SlotCache, ref: RefCache, layer: int, routed: list[int]) -> list[LayerWave]:
    """One layer of one step, real and reference side by side, then release."""
    before = resident_slots(cache, layer)
    capacity = cache.unpinned_capacity
    waves = cache.plan_layer(layer, routed)
    assert [plain(w) for w in waves] == ref.plan(layer, routed)
    check_wave_spec(cache, layer, routed, before, waves, capacity)
    assert_same_state(cache, ref)
    cache.release_layer(layer)
    ref.release(layer)
    cache.check_invariants()
    return waves


def routing(rng: random.Random, experts: int, top_k: int, tokens: int) -> list[int]:
    """The union of each token's top-k, in routing order with repeats (as topk_ids.flatten())."""
    return [e for _ in range(tokens) for e in rng.sample(range(experts), top_k)]


# ---- random routing -----------------------------------------------------------------

CONFIGS = [  # (slots, layers, experts, top_k, max tokens per step)
    (4, 3, 16, 4, 1),  # pool = top_k, decode
    (4, 3, 16, 4, 3),  # pool = top_k, a batch: every layer needs waves
    (10, 4, 12, 2, 4),
    (7, 2, 32, 3, 8),  # routed sets often larger than the pool
    (64, 3, 16, 4, 4),  # everything fits: never an eviction
]


@pytest.mark.parametrize("kind,max_average", [("lru", 16), ("lru-plain", 16), ("lfu", 16), ("lfu", 3)])
@pytest.mark.parametrize("config", CONFIGS)
def test_random_routing_matches_reference(config: tuple[int, ...], kind: str, max_average: int) -> None:
    slots, layers, experts, top_k, max_tokens = config
    cache, ref = make_pair(slots, layers, experts, kind, max_average)
    rng = random.Random(hash(config) % 1000)
    for _ in range(60):
        tokens = rng.randint(1, max_tokens)
        for layer in range(layers):
            drive(cache, ref, layer, routing(rng, experts, top_k, tokens))
    if slots >= layers * experts:
        assert cache.stats.total_evictions == 0


class SlotMachine(RuleBasedStateMachine):
    """Arbitrary plan/release orders, including several layers pinned at once."""

    @initialize(
        slots=st.integers(1, 8),
        layers=st.integers(1, 4),
        experts=st.integers(1, 10),
        kind=st.sampled_from(["lru", "lru-plain", "lfu"]),
        max_average=st.integers(1, 5),
    )
    def setup(self, slots: int, layers: int, experts: int, kind: str, max_average: int) -> None:
        self.cache, self.ref = make_pair(slots, layers, experts, kind, max_average)

    @rule(data=st.data())
    def plan(self, data: st.DataObject) -> None:
        layer = data.draw(st.integers(0, self.cache.num_layers - 1))
        routed = data.draw(st.lists(st.integers(0, self.cache.num_experts - 1), max_size=14))
        try:
            expected = self.ref.plan(layer, routed)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                self.cache.plan_layer(layer, routed)
            return
        before = resident_slots(self.cache, layer)
        capacity = self.cache.unpinned_capacity
        waves = self.cache.plan_layer(layer, routed)
        assert [plain(w) for w in waves] == expected
        check_wave_spec(self.cache, layer, routed, before, waves, capacity)

    @precondition(lambda self: hasattr(self, "ref") and self.ref.pinned)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        layer = data.draw(st.sampled_from(sorted(self.ref.pinned)))
        self.cache.release_layer(layer)
        self.ref.release(layer)

    @invariant()
    def same_state(self) -> None:
        if hasattr(self, "ref"):
            assert_same_state(self.cache, self.ref)
            assert self.cache.pinned_layers == set(self.ref.pinned)


TestSlotMachine = SlotMachine.TestCase
TestSlotMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# ---- adversarial routing ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lru", "lru-plain", "lfu"])
def test_cyclic_scan_one_larger_than_the_pool(kind: str) -> None:
    # S+1 experts of ONE layer in a cycle: LRU's worst case, every use a miss once warm.
    # The scan-resistant LRU does not see it: a layer's step is one of its own plans, so
    # every unprotected key is stale and its choice is plain LRU's (it resists cycles
    # over the layers, below).
    cache, ref = make_pair(4, 2, 8, kind)
    for step in range(40):
        drive(cache, ref, 0, [step % 5])
    if kind != "lfu":
        assert cache.stats.total_hits == 0
    for step in range(10):  # the whole cycle in one step: two waves every time
        waves = drive(cache, ref, 0, list(range(5)))
        assert len(waves) == 2


@pytest.mark.parametrize("kind", ["lru", "lru-plain", "lfu"])
def test_all_experts_of_a_layer_at_once(kind: str) -> None:
    cache, ref = make_pair(6, 3, 16, kind)
    rng = random.Random(7)
    for step in range(12):
        layer = step % 3
        if step % 4 == 3:
            drive(cache, ref, layer, rng.sample(range(16), 3))  # some decode in between
        waves = drive(cache, ref, layer, rng.sample(range(16), 16))
        assert len(waves) == 3 and [len(w.experts) for w in waves] == [6, 6, 4]


def layer_cycle_hits(kind: str, layers: int, top_k: int, slots: int, steps: int) -> list[int]:
    """Hits per decode step when every step routes the same `top_k` experts in each of
    `layers` layers (a repeating routing), cycled through `slots` slots."""
    cache, ref = make_pair(slots, layers, 2 * top_k, kind)
    out = []
    for _ in range(steps):
        before = cache.stats.total_hits
        for layer in range(layers):
            drive(cache, ref, layer, [2 * e + layer % 2 for e in range(top_k)])
        out.append(cache.stats.total_hits - before)
    return out


def test_scan_resistant_lru_hits_where_plain_lru_never_does() -> None:
    """6 layers x top-2 = 12 keys a step through 9 slots. Plain LRU evicts every key just
    before its reuse: 0 hits, every step. The scan-resistant rule evicts the key used
    last (the previous layer's, needed farthest ahead) once no key is stale, and keeps
    most of the cycle (as many hits as Belady's MIN: tests/moe/test_replay.py)."""
    plain = layer_cycle_hits("lru-plain", 6, 2, 9, 12)
    scan = layer_cycle_hits("lru", 6, 2, 9, 12)
    assert plain == [0] * 12
    steady = scan[2:]  # after the warm-up steps (the pool fills in step 0)
    assert min(steady) > 0, scan
    assert sum(steady) / len(steady) >= 9 - 2, scan  # the plan model's floor: slots - one layer's experts


def test_scan_resistant_lru_is_plain_lru_when_the_pool_holds_a_step() -> None:
    """With room for a step's experts and one more layer's ((L + 1) x K slots), a stale
    key is always there to evict at batch 1: the same waves as plain LRU, wave by wave."""
    layers, experts, top_k = 4, 16, 2
    scan, ref_scan = make_pair((layers + 1) * top_k, layers, experts, "lru")
    lru, ref_lru = make_pair((layers + 1) * top_k, layers, experts, "lru-plain")
    rng = random.Random(11)
    for _ in range(80):
        for layer in range(layers):
            routed = routing(rng, 6, top_k, 1)  # 6 of 16 experts: repeats and new ones
            assert [plain(w) for w in drive(scan, ref_scan, layer, routed)] == [
                plain(w) for w in drive(lru, ref_lru, layer, routed)]
    assert 0 < scan.stats.total_hits < scan.stats.total_hits + scan.stats.total_misses


def test_pool_at_top_k_minimum_with_a_batch() -> None:
    cache, ref = make_pair(8, 4, 64, "lfu")
    rng = random.Random(3)
    for _ in range(30):
        for layer in range(4):
            waves = drive(cache, ref, layer, routing(rng, 64, 8, 4))  # up to 32 experts
            assert all(len(w.experts) <= 8 for w in waves)


@pytest.mark.parametrize("kind", ["lru", "lru-plain", "lfu"])
def test_repeated_same_expert(kind: str) -> None:
    cache, ref = make_pair(2, 2, 4, kind)
    waves = drive(cache, ref, 1, [3, 3, 3, 3])
    assert [plain(w) for w in waves] == [((3,), (0,), 0, ((3, 0, None),))]
    for _ in range(5):
        (wave,) = drive(cache, ref, 1, [3])
        assert wave.num_hits == 1 and wave.slots == (0,)
    assert cache.stats.hits[1] == 5 and cache.stats.misses[1] == 1


def test_tensor_routing_is_accepted() -> None:
    cache = SlotCache(4, 1, 8)
    (wave,) = cache.plan_layer(0, torch.tensor([[5, 1], [1, 2]]))
    assert wave.experts == (5, 1, 2) and wave.slots == (0, 1, 2)
    assert cache.slot_map[0].tolist() == [-1, 1, 2, -1, -1, 0, -1, -1]
    assert cache.slot_owners[:3].tolist() == [[0, 5], [0, 1], [0, 2]]
    assert cache.resident_experts(0) == [1, 2, 5]
    cache.release_layer(0)
    version = cache.map_version
    (wave,) = cache.plan_layer(0, [2, 7])
    assert wave.hit_mask == (True, False) and cache.map_version == version + 1
    assert cache.partition(0, [7, 6, 7]) == ((7,), (6,))
    cache.release_layer(0)
    cache.plan_layer(0, [7])  # all hits: the map is unchanged, a device mirror stays valid
    assert cache.map_version == version + 1


# ---- protection, errors, the checker ------------------------------------------------


def test_other_pinned_layers_are_protected_and_shrink_waves() -> None:
    cache = SlotCache(4, 2, 8)
    cache.plan_layer(0, [0, 1])  # not released: still running (or prefetched)
    waves = cache.plan_layer(1, [0, 1, 2, 3, 4])
    assert [len(w.experts) for w in waves] == [2, 2, 1]
    assert all(m.evicted is None or m.evicted.layer == 1 for w in waves for m in w.misses)
    assert cache.lookup(0, 0) is not None and cache.lookup(0, 1) is not None
    cache.check_invariants()
    cache.release_layer(1)
    cache.plan_layer(1, [5])
    with pytest.raises(RuntimeError, match="already pinned"):
        cache.plan_layer(0, [0])
    cache.release_all()
    assert cache.pinned_layers == frozenset()


def test_plan_fails_cleanly_when_everything_is_pinned() -> None:
    cache = SlotCache(2, 3, 4)
    cache.plan_layer(0, [0])
    cache.plan_layer(1, [0])
    with pytest.raises(RuntimeError, match="all 2 slots are pinned"):
        cache.plan_layer(2, [1])
    assert cache.plan_layer(2, []) == []  # nothing routed: nothing needed
    cache.check_invariants()


def test_layer_waves_releases_on_error() -> None:
    cache = SlotCache(2, 1, 4)
    with pytest.raises(ZeroDivisionError):
        with cache.layer_waves(0, [1, 2]):
            1 / 0
    assert cache.pinned_layers == frozenset()


def test_bad_arguments() -> None:
    cache = SlotCache(2, 2, 4)
    with pytest.raises(ValueError):
        cache.plan_layer(2, [0])
    with pytest.raises(ValueError):
        cache.plan_layer(0, [4])
    with pytest.raises(KeyError):
        cache.release_layer(1)
    with pytest.raises(ValueError):
        SlotCache(0, 1, 1)
    used = make_policy("lru")
    used.insert(0)
    with pytest.raises(ValueError, match="start empty"):
        SlotCache(2, 1, 1, used)


def test_a_policy_that_picks_a_protected_key_is_caught() -> None:
    class Rogue(LRUPolicy):
        def victims(self, protected, n):  # type: ignore[no-untyped-def, override]
            return list(self.keys())[-n:] if n else []  # the newest: in the current wave

    cache = SlotCache(2, 1, 4, Rogue())
    cache.plan_layer(0, [0, 1])
    cache.release_layer(0)
    with pytest.raises(RuntimeError, match="protected"):
        cache.plan_layer(0, [0, 2])


def test_check_invariants_catches_corruption() -> None:
    cache = SlotCache(3, 1, 4)
    cache.plan_layer(0, [0, 1])
    cache.check_invariants()
    cache.slot_map[0, 3] = 2  # a stale device-side entry
    with pytest.raises(AssertionError, match="slot_map"):
        cache.check_invariants()
    cache.slot_map[0, 3] = -1
    cache.policy.remove(cache.pack(0, 1))
    with pytest.raises(AssertionError, match="policy"):
        cache.check_invariants()


# ---- behaviour: what frequency buys ------------------------------------------------


def hit_rate(policy: str, skew: float, tokens: int = 1500, seed: int = 0, **options: int) -> float:
    """Decode at batch 1 through a pool of 1/4 of all experts; per-layer popularity
    ~ rank**-skew (0 = uniform) over a random permutation of each layer's experts."""
    layers, experts, slots, top_k = 4, 64, 64, 4
    gen = torch.Generator().manual_seed(seed)
    weight = torch.arange(1, experts + 1, dtype=torch.float64) ** -skew
    probs = [weight[torch.randperm(experts, generator=gen)] for _ in range(layers)]
    cache = SlotCache(slots, layers, experts, make_policy(policy, **options))
    for _ in range(tokens):
        for layer in range(layers):
            with cache.layer_waves(layer, torch.multinomial(probs[layer], top_k, generator=gen)):
                pass
    return cache.stats.hit_rate


def test_lfu_beats_lru_under_skewed_routing() -> None:
    lru, lfu = hit_rate("lru", skew=1.0), hit_rate("lfu", skew=1.0)
    assert lfu > lru + 0.05, (lru, lfu)  # a margin of > 15 sd of the sampling error (see below)


def test_lfu_matches_lru_under_uniform_routing() -> None:
    lru, lfu = hit_rate("lru", skew=0.0), hit_rate("lfu", skew=0.0)
    # sampling error, not rounding: 1,500 tokens x 4 layers x top-4 = 24,000 accesses, binomial
    # sd ~0.003 at p = 0.25; 0.03 leaves 10 sd for the correlation of consecutive accesses
    assert abs(lfu - lru) < 0.03, (lru, lfu)
    assert abs(lru - 0.25) < 0.05  # uniform references: any policy hits at the pool's share, a quarter


def test_lfu_ageing_follows_a_shift_in_popularity() -> None:
    """After the hot set changes, aged counts let the new hot experts in; unaged
    counts keep the old ones resident long after they cooled."""

    def second_phase_hit_rate(**options: int) -> float:
        layers, experts, slots, top_k = 4, 64, 64, 4
        gen = torch.Generator().manual_seed(1)
        weight = torch.arange(1, experts + 1, dtype=torch.float64) ** -1.0
        cache = SlotCache(slots, layers, experts, make_policy("lfu", **options))
        for phase in range(2):
            probs = [weight[torch.randperm(experts, generator=gen)] for _ in range(layers)]
            for token in range(1500):
                if phase == 1 and token == 750:
                    cache.reset_stats()
                for layer in range(layers):
                    with cache.layer_waves(layer, torch.multinomial(probs[layer], top_k, generator=gen)):
                        pass
        return cache.stats.hit_rate

    aged, unaged = second_phase_hit_rate(), second_phase_hit_rate(max_average=10**9)
    assert aged > unaged + 0.03, (aged, unaged)
