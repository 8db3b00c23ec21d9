"""Replaying a routing trace through slot-cache policies: the scan-resistant LRU ("lru"),
plain LRU ("lru-plain") and LFU (`moe/policy.py`, driven through the real `SlotCache`)
and Belady's MIN (evict the resident expert whose
next use is farthest in the future), the bound no online policy can beat.

Counting: a routed (layer, expert) is a hit if resident when its layer is planned, else
a miss; every miss is loaded (demand paging), evicting when the pool is full, never an
expert of the layer being planned. Until the pool first has to evict, every policy
makes the same moves, so those accesses (compulsory misses, a cold start no policy
controls) are excluded from `hit_rate` and reported apart (`warmup_accesses`;
`hit_rate_all` counts everything).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from edgemoe.moe.routing_trace import Access
from edgemoe.moe.slots import SlotCache

REPLAYED = ("lru", "lru-plain", "lfu")  # the online policies `compare_policies` replays


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    hits: int  # after the warm-up
    misses: int
    hits_all: int  # over the whole trace
    misses_all: int
    cpu: int = 0  # of the misses after the warm-up, those computed on the CPU (`replay_share`)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else None

    @property
    def hit_rate_all(self) -> float | None:
        uses = self.hits_all + self.misses_all
        return self.hits_all / uses if uses else None

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "hit_rate": self.hit_rate, "hit_rate_all": self.hit_rate_all}


def warmup_accesses(trace: Sequence[Access], num_slots: int) -> int:
    """Index of the first access that needs an eviction (len(trace) if none does)."""
    seen: set[tuple[int, int]] = set()
    for i, (layer, experts) in enumerate(trace):
        seen.update((layer, e) for e in experts)
        if len(seen) > num_slots:
            return i
    return len(trace)


def replay_policy(trace: Sequence[Access], num_slots: int, num_layers: int, num_experts: int,
                  policy: str) -> ReplayResult:
    """`policy` ("lru", "lru-plain", "lfu") driving a fresh `SlotCache` over the trace."""
    cache = SlotCache(num_slots, num_layers, num_experts, policy)
    warm = warmup_accesses(trace, num_slots)
    counts = [0, 0, 0, 0]  # hits, misses after warm-up; hits, misses in all
    for i, (layer, experts) in enumerate(trace):
        _count(counts, i >= warm, *_plan(cache, layer, experts))
    return ReplayResult(policy, *counts)


def _plan(cache: SlotCache, layer: int, experts: Sequence[int]) -> tuple[int, int]:
    """(hits, misses) of the cache planning one layer access (its misses loaded)."""
    with cache.layer_waves(layer, experts) as waves:
        return sum(w.num_hits for w in waves), sum(len(w.misses) for w in waves)


def replay_share(trace: Sequence[Access], num_slots: int, num_layers: int, num_experts: int,
                 quota: Sequence[int], policy: str = "lru", pick: str = "heat",
                 heat_shift: int | None = None, fraction: int | None = None,
                 observe: Callable[[int, int, int], None] | None = None) -> ReplayResult:
    """`policy` with the hybrid backend's CPU share (`moe/cpu_share.py`): at each access
    the layer's `quota[layer]` coldest misses — lowest heat, ties to the higher id, heat
    decaying by 1/2**HEAT_SHIFT an access and rising by HEAT_UNIT per routed expert, as
    `kernels/share_split.py` keeps it — are computed where they lie and never loaded, so
    they miss again at their next use; the rest plan as in `replay_policy`. Its misses
    count the CPU's. What the share's admission rule costs in misses against plain
    `policy` on the same trace (a batch's routings of an expert count once).
    `pick="farthest"`: the misses whose next use is farthest instead (future knowledge,
    ties to the higher id) — what a perfect prediction of reuse could pick. `heat_shift`:
    another decay of the heat (1/2**shift an access; the engine's HEAT_SHIFT by default).
    `fraction`: the pick takes at most that many sixteenths of each access's misses too
    (`kernels/share_split.decode_take`; None: the quota alone). `observe(layer, misses,
    cpu)`: called for every access after the warm-up with its misses and the CPU's part of
    them (a per-layer time model's input: scripts/share_layer_model.py)."""
    from edgemoe.kernels.share_split import decode_take
    from edgemoe.kernels.share_state import FRACTION_ONE, HEAT_SHIFT
    from edgemoe.moe.cpu_share import HEAT_UNIT

    shift = HEAT_SHIFT if heat_shift is None else heat_shift
    part = FRACTION_ONE if fraction is None else fraction
    if pick not in ("heat", "farthest"):
        raise ValueError(f"pick must be 'heat' or 'farthest' (got {pick!r})")
    cache = SlotCache(num_slots, num_layers, num_experts, policy)
    heat = [[0] * num_experts for _ in range(num_layers)]
    warm = warmup_accesses(trace, num_slots)
    later = _next_uses([[(a.layer, e) for e in a.experts] for a in trace]) if pick == "farthest" else None
    counts, cpu = [0, 0, 0, 0], 0
    for i, (layer, experts) in enumerate(trace):
        missed = {e for e in experts if cache.lookup(layer, e) is None}
        take = decode_take(len(missed), quota[layer], part)
        if later is None:
            cold = _coldest(missed, heat[layer], take)
        else:
            cold = _farthest(missed, dict(zip(experts, later[i])), take)
        hits, misses = _plan(cache, layer, [e for e in experts if e not in cold])
        _count(counts, i >= warm, hits, misses + len(cold))
        cpu += len(cold) if i >= warm else 0
        if observe is not None and i >= warm:
            observe(layer, misses + len(cold), len(cold))
        row = heat[layer]
        for e in range(num_experts):
            row[e] -= row[e] >> shift
        for e in set(experts):
            row[e] += HEAT_UNIT
    return ReplayResult(f"{policy}+share", *counts, cpu=cpu)


def _coldest(misses: set[int], heat: list[int], take: int) -> set[int]:
    return set(sorted(misses, key=lambda e: (heat[e], -e))[:take])


def _farthest(misses: set[int], next_use: dict[int, int], take: int) -> set[int]:
    return set(sorted(misses, key=lambda e: (-next_use[e], -e))[:take])


def replay_belady(trace: Sequence[Access], num_slots: int) -> ReplayResult:
    """Belady's MIN over the trace (layer sets larger than the pool are refused)."""
    keyed = [[(a.layer, e) for e in a.experts] for a in trace]
    if any(len(keys) > num_slots for keys in keyed):
        raise ValueError(f"a layer routes to more experts than the {num_slots} slots: MIN needs waves")
    nxt = _next_uses(keyed)
    warm = warmup_accesses(trace, num_slots)
    resident: dict[tuple[int, int], int] = {}  # key -> index of its next use
    heap: list[tuple[int, tuple[int, int]]] = []  # (-next use, key), lazily stale
    counts = [0, 0, 0, 0]
    for i, keys in enumerate(keyed):
        protected = set(keys)
        misses = [k for k in keys if k not in resident]
        for j, k in enumerate(keys):
            if k not in resident and len(resident) >= num_slots:
                _evict_farthest(resident, heap, protected)
            resident[k] = nxt[i][j]  # a hit's next use moves on; a miss is loaded
            heapq.heappush(heap, (-nxt[i][j], k))
        _count(counts, i >= warm, len(keys) - len(misses), len(misses))
    return ReplayResult("belady", *counts)


def _next_uses(keyed: list[list[tuple[int, int]]]) -> list[list[int]]:
    """For each access's keys, the index of the key's next access (a large number if none)."""
    never = len(keyed) + 1
    upcoming: dict[tuple[int, int], int] = {}
    out: list[list[int]] = [[] for _ in keyed]
    for i in range(len(keyed) - 1, -1, -1):
        out[i] = [upcoming.get(k, never) for k in keyed[i]]
        for k in keyed[i]:
            upcoming[k] = i
    return out


def _evict_farthest(resident: dict[tuple[int, int], int], heap: list[tuple[int, tuple[int, int]]],
                    protected: set[tuple[int, int]]) -> None:
    held = []
    while heap:
        neg, key = heapq.heappop(heap)
        if resident.get(key) != -neg:
            continue  # stale: used again since, or already evicted
        if key in protected:
            held.append((neg, key))
            continue
        del resident[key]
        break
    else:
        raise RuntimeError("no unprotected resident expert to evict")
    for entry in held:
        heapq.heappush(heap, entry)


def _count(counts: list[int], after_warmup: bool, hits: int, misses: int) -> None:
    counts[2] += hits
    counts[3] += misses
    if after_warmup:
        counts[0] += hits
        counts[1] += misses


def compare_policies(trace: Sequence[Access], num_slots: int, num_layers: int, num_experts: int) -> dict[str, object]:
    """Every policy and Belady on one trace at `num_slots` (the JSON `bench decode` reports)."""
    results = [replay_policy(trace, num_slots, num_layers, num_experts, p) for p in REPLAYED]
    try:
        results.append(replay_belady(trace, num_slots))
    except ValueError as e:
        belady_error = str(e)
    else:
        belady_error = None
    return {
        "slots": num_slots, "accesses": len(trace), "warmup_accesses": warmup_accesses(trace, num_slots),
        **{r.policy: r.as_dict() for r in results},
        **({"belady_skipped": belady_error} if belady_error else {}),
    }
