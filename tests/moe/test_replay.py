"""Trace replays: Belady's MIN equals the fewest misses any eviction sequence achieves
(brute force over every choice, small traces); the plain LRU replay equals a plain LRU
model; every policy ≤ Belady in hits; on a repeating layer cycle larger than the pool the
scan-resistant LRU hits as often as Belady (plain LRU never); the warm-up excludes
exactly the accesses before the first eviction; the CPU share's replay equals a plain LRU
whose coldest misses (a plain decayed-heat model) are never loaded."""

from __future__ import annotations

import functools
import random
from collections import OrderedDict

import pytest

from edgemoe.moe.replay import (
    compare_policies,
    replay_belady,
    replay_policy,
    replay_share,
    warmup_accesses,
)
from edgemoe.moe.routing_trace import Access


def random_trace(rng: random.Random, length: int, layers: int, experts: int, max_set: int) -> list[Access]:
    return [Access(i % layers, tuple(sorted(rng.sample(range(experts), rng.randint(1, max_set)))))
            for i in range(length)]


def brute_force_misses(trace: list[Access], slots: int) -> int:
    """Fewest misses over every demand-paging schedule: at each miss with a full pool,
    try evicting each resident key not routed by the current layer."""

    @functools.cache
    def best(i: int, resident: frozenset) -> int:
        if i == len(trace):
            return 0
        keys = [(trace[i].layer, e) for e in trace[i].experts]
        missing = [k for k in keys if k not in resident]
        return len(missing) + min(
            best(i + 1, after) for after in _loads(resident, missing, set(keys), slots)
        )

    return best(0, frozenset())


def _loads(resident: frozenset, missing: list, protected: set, slots: int):  # noqa: ANN202
    """Every pool reachable by loading `missing` one by one, evicting when full."""
    states = {resident}
    for k in missing:
        nxt = set()
        for s in states:
            if len(s) < slots:
                nxt.add(s | {k})
            else:
                nxt.update((s - {v}) | {k} for v in s if v not in protected)
        states = nxt
    return states


@pytest.mark.parametrize("seed", range(12))
def test_belady_is_optimal_on_small_traces(seed: int) -> None:
    rng = random.Random(seed)
    trace = random_trace(rng, length=9, layers=2, experts=3, max_set=2)
    slots = rng.choice([2, 3])
    got = replay_belady(trace, slots)
    assert got.misses_all == brute_force_misses(trace, slots)


def plain_lru_hits(trace: list[Access], slots: int) -> tuple[int, int]:
    """An independent LRU: hits touch in routed order, misses evict the oldest key that
    the current layer does not route."""
    order: OrderedDict = OrderedDict()
    hits = misses = 0
    for layer, experts in trace:
        keys = [(layer, e) for e in experts]
        for k in keys:
            if k in order:
                hits += 1
                order.move_to_end(k)
        for k in keys:
            if k in order:
                continue
            misses += 1
            if len(order) >= slots:
                victim = next(v for v in order if v not in keys)
                del order[victim]
            order[k] = None
    return hits, misses


@pytest.mark.parametrize("seed", range(6))
def test_lru_replay_matches_a_plain_lru_and_belady_bounds_it(seed: int) -> None:
    rng = random.Random(100 + seed)
    trace = random_trace(rng, length=300, layers=4, experts=16, max_set=4)
    lru = replay_policy(trace, 12, 4, 16, "lru-plain")
    assert (lru.hits_all, lru.misses_all) == plain_lru_hits(trace, 12)
    best = replay_belady(trace, 12)
    lfu, scan = replay_policy(trace, 12, 4, 16, "lfu"), replay_policy(trace, 12, 4, 16, "lru")
    uses = sum(len(a.experts) for a in trace)
    for r in (lru, lfu, scan, best):
        assert r.hits_all + r.misses_all == uses
        assert best.hits_all >= r.hits_all and best.hits >= r.hits


@pytest.mark.parametrize("layers,top_k,slots", [(6, 2, 9), (12, 4, 40), (48, 8, 276)])
def test_scan_resistant_lru_matches_belady_on_a_repeating_layer_cycle(layers: int, top_k: int, slots: int) -> None:
    """Every step routes the same experts (a repeating routing; the 48 x 8 / 276 case is
    Qwen3-30B-A3B at 8 GiB): plain LRU thrashes, the scan-resistant rule gets Belady's
    hits, and the plan model's floor (slots - one layer's experts) / a step's experts holds."""
    trace = [Access(layer, tuple(range(layer % 3, layer % 3 + top_k))) for _ in range(12) for layer in range(layers)]
    experts = top_k + 3
    scan, plain = (replay_policy(trace, slots, layers, experts, p) for p in ("lru", "lru-plain"))
    best = replay_belady(trace, slots)
    assert plain.hits == 0
    assert scan.hits == best.hits
    assert scan.hit_rate >= (slots - top_k) / (layers * top_k)


def test_warmup_ends_at_the_first_eviction() -> None:
    trace = [Access(0, (0, 1)), Access(1, (0,)), Access(0, (0, 2)), Access(1, (1, 2))]
    assert warmup_accesses(trace, 3) == 2  # keys so far: (0,0) (0,1) (1,0), then (0,2) needs a slot
    assert warmup_accesses(trace, 10) == len(trace)
    out = compare_policies(trace, 3, 2, 3)
    for name in ("lru", "lru-plain", "lfu", "belady"):
        r = out[name]
        assert r["hits"] + r["misses"] == 4  # the last two accesses: 2 + 2 routed experts
        assert r["hits_all"] + r["misses_all"] == 7
    assert out["warmup_accesses"] == 2 and out["slots"] == 3


def test_belady_refuses_sets_larger_than_the_pool() -> None:
    trace = [Access(0, (0, 1, 2))]
    with pytest.raises(ValueError, match="waves"):
        replay_belady(trace, 2)
    assert "belady_skipped" in compare_policies(trace, 2, 1, 3)


def next_use_scan(trace: list[Access], i: int, layer: int, e: int) -> int:
    """The index of (layer, e)'s next access after i, by a forward scan (len + 1: none)."""
    return next((j for j in range(i + 1, len(trace)) if trace[j].layer == layer and e in trace[j].experts),
                len(trace) + 1)


def plain_lru_with_share(trace: list[Access], slots: int, experts: int, quota: list[int],
                         farthest: bool = False, shift: int = 3, fraction: int = 16) -> tuple[int, int, int]:
    """(hits, misses, misses skipped) over the whole trace of a plain LRU (OrderedDict) where, at each
    access, the quota[layer] misses of lowest heat (ties: the higher id first) are not
    loaded; heat: each access keeps 1 - 1/2**shift of it (integer shift) and adds 1024 per routed expert.
    `farthest`: the misses whose next access is farthest are skipped instead (ties: the higher id).
    `fraction`: at most that many sixteenths of the access's misses (rounded half up) are skipped."""
    lru: OrderedDict = OrderedDict()
    heat = {layer: [0] * experts for layer in {a.layer for a in trace}}
    hits = misses = cpu = 0
    for i, (layer, routed) in enumerate(trace):
        missing = [e for e in routed if (layer, e) not in lru]
        take = min(quota[layer], (fraction * len(missing) + 8) // 16)
        if farthest:
            skipped = sorted(missing, key=lambda e: (-next_use_scan(trace, i, layer, e), -e))[:take]
        else:
            skipped = sorted(missing, key=lambda e: (heat[layer][e], -e))[:take]
        for e in routed:
            if (layer, e) in lru:
                hits += 1
                lru.move_to_end((layer, e))
        for e in missing:
            misses += 1
            if e in skipped:
                cpu += 1
                continue
            if len(lru) >= slots:
                victim = next(k for k in lru if not (k[0] == layer and k[1] in routed))
                del lru[victim]
            lru[(layer, e)] = True
        heat[layer] = [h - (h >> shift) + (1024 if e in routed else 0) for e, h in enumerate(heat[layer])]
    return hits, misses, cpu


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("pick,shift,fraction", [("heat", None, None), ("heat", 6, None), ("farthest", None, None),
                                                 ("heat", None, 10), ("farthest", None, 5)])
def test_share_replay_matches_a_plain_lru_that_skips_the_picked_misses(seed: int, pick: str, shift: int | None,
                                                                       fraction: int | None) -> None:
    rng = random.Random(seed)
    layers, experts = 3, 10
    trace = random_trace(rng, 300, layers, experts, 4)
    quota = [rng.randint(0, 2) if fraction is None else experts for _ in range(layers)]
    slots = rng.randint(4, 9)
    seen: list[tuple[int, int, int]] = []
    got = replay_share(trace, slots, layers, experts, quota, "lru-plain", pick, heat_shift=shift, fraction=fraction,
                       observe=lambda *access: seen.append(access))
    hits, misses, cpu = plain_lru_with_share(trace, slots, experts, quota, farthest=pick == "farthest",
                                             shift=3 if shift is None else shift,
                                             fraction=16 if fraction is None else fraction)
    assert (got.hits_all, got.misses_all) == (hits, misses)
    # what `observe` heard: every access after the warm-up, its misses and the CPU's part
    assert sum(m for _, m, _ in seen) == got.misses and sum(c for _, _, c in seen) == got.cpu
    assert len(seen) == len(trace) - warmup_accesses(trace, slots)
    # the CPU's count is after the warm-up; before the pool first fills, the share skips the same
    assert got.cpu <= cpu and (got.cpu == cpu or warmup_accesses(trace, slots) > 0)
    assert got.policy == "lru-plain+share"


def test_share_replay_without_a_quota_is_the_policy_and_with_every_miss_loads_nothing() -> None:
    rng = random.Random(5)
    trace = random_trace(rng, 200, 2, 12, 5)
    for policy in ("lru", "lru-plain"):
        plain = replay_policy(trace, 6, 2, 12, policy)
        none = replay_share(trace, 6, 2, 12, [0, 0], policy)
        assert (none.hits, none.misses, none.hits_all, none.misses_all) == (
            plain.hits, plain.misses, plain.hits_all, plain.misses_all)
    every = replay_share(trace, 6, 2, 12, [5, 5])  # a quota as large as any set: nothing is ever loaded
    assert every.hits_all == 0 and every.misses_all == sum(len(a.experts) for a in trace)
    with pytest.raises(ValueError, match="pick"):
        replay_share(trace, 6, 2, 12, [1, 1], pick="coldest")
