"""Eviction policies for the expert slot cache: which resident expert gives up its slot.

A policy only orders keys; it never sees slots or tensors. `SlotCache` (moe/slots.py)
owns one policy and drives it, and tells it where each wave of a layer begins and ends
(`begin_wave` / `end_wave`: the scan-resistant LRU needs the layer's cycle). Policies
are chosen by name through `make_policy`: "lru" (scan-resistant, the default),
"lru-plain" (pure LRU, for A/B runs) and "lfu".
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Collection, Iterator
from typing import ClassVar

# A key names one (layer, expert) as the packed int `layer * num_experts + expert`
# (`SlotCache.pack`). Policies treat it as opaque: an int hashes and compares faster
# than a tuple, and it is also the flat index into the [L, E] slot map.
Key = int


class EvictionPolicy(ABC):
    """Orders the resident keys of one slot cache by how willing we are to evict them.

    Contract:
    - The policy tracks exactly the resident keys: `insert(key)` when a key gets a
      slot, `remove(key)` when it loses it. `keys()` is that set at every moment.
    - `insert` counts as a use of the key (it was loaded because it is about to run);
      `touch` is a later use of an already resident key (a hit).
    - `victims(protected, n)` names the `n` keys to evict next, best victim first,
      among tracked keys not in `protected`. It does not evict: the caller then calls
      `remove` on each. Choosing all of a wave's victims at once is the same as
      choosing them one by one with the chosen ones removed, and is cheaper.
    - Deterministic: the same call sequence always gives the same victims (tests
      compare against reference models; the engine's behaviour must be replayable).
    - Misuse raises: `insert` of a tracked key -> ValueError; `touch`/`remove` of an
      untracked key -> KeyError; fewer than `n` unprotected keys -> LookupError.

    - Waves: the cache calls `begin_wave(layer)` before a wave's first `touch`/`insert`
      and `end_wave(layer)` after its last; policies that ignore layers inherit no-ops.

    Lifetime: one policy per `SlotCache`, created empty, living as long as the cache.
    Locking: none. Policies are not thread-safe; the owning cache serialises all calls
    (it runs on the engine's forward thread).
    """

    name: ClassVar[str]

    @abstractmethod
    def insert(self, key: Key) -> None:
        """`key` became resident and is being used now."""

    @abstractmethod
    def touch(self, key: Key) -> None:
        """Resident `key` is being used again (a hit)."""

    @abstractmethod
    def remove(self, key: Key) -> None:
        """`key` lost its slot (evicted or invalidated)."""

    @abstractmethod
    def victims(self, protected: Collection[Key], n: int) -> list[Key]:
        """The `n` keys to evict next, best victim first, none of them in `protected`."""

    @abstractmethod
    def keys(self) -> Iterator[Key]:
        """Every tracked (resident) key, in no promised order."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    def begin_wave(self, layer: int) -> None:
        """A wave of `layer` begins: its hits are touched, victims chosen, misses inserted."""

    def end_wave(self, layer: int) -> None:
        """The wave of `layer` begun by `begin_wave` has made all its uses."""

    def victim(self, protected: Collection[Key]) -> Key:
        """The single key to evict next among unprotected resident keys."""
        return self.victims(protected, 1)[0]


def _not_enough(n: int, found: int) -> LookupError:
    return LookupError(f"need {n} unprotected resident keys to evict, found {found}")


class LRUPolicy(EvictionPolicy):
    """Least recently used first ("lru-plain"). O(1) per use: an OrderedDict in use order.

    `victims` walks from the oldest end and skips protected keys; those are the ones
    used in the current wave, so they sit at the young end and the walk is short.

    NOTE: a scan of more keys than the pool (every layer's experts of a decode token,
    repeating, through fewer slots) makes pure LRU miss every key every step;
    `ScanLRUPolicy` ("lru", the default) is the fix, this stays for A/B runs.
    """

    name: ClassVar[str] = "lru-plain"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()  # oldest use first

    def insert(self, key: Key) -> None:
        if key in self._order:
            raise ValueError(f"key {key} is already tracked")
        self._order[key] = None

    def touch(self, key: Key) -> None:
        self._order.move_to_end(key)

    def remove(self, key: Key) -> None:
        del self._order[key]

    def victims(self, protected: Collection[Key], n: int) -> list[Key]:
        out: list[Key] = []
        if n <= 0:
            return out
        for key in self._order:
            if key not in protected:
                out.append(key)
                if len(out) == n:
                    return out
        raise _not_enough(n, len(out))

    def keys(self) -> Iterator[Key]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order


class ScanLRUPolicy(LRUPolicy):
    """LRU that resists scans ("lru", the default): stale keys least recent first, then,
    when none is left, the MOST recently used key.

    Why: the pool is shared by all layers and a decode step visits them in a cycle. When
    the keys one step uses outnumber the slots, pure LRU evicts each key just before its
    next use and every key misses every step (48 layers x 8 experts through 276 slots: no
    hit at all). In a cyclic scan the key used last is the one needed farthest ahead, so
    evicting it (Belady's choice for a scan) keeps most of the cycle resident and streams
    the rest through a few slots. With a pool larger than a step's keys, stale keys always
    exist at eviction time and the choice is plain LRU's.

    Rules (identical in `DeviceSlotCache` and its fused kernel; tests prove it wave by wave):
    - A clock counts uses: every `insert`/`touch` stamps the key with the clock's value,
      then advances it by 1 (the stamps are the device cache's recency values).
    - `end_wave(layer)` records the clock then: the end of the layer's last wave.
    - `begin_wave(layer)` sets the threshold: that recorded end (0 for a layer never
      planned). A key is stale if its stamp is below the threshold: it was not used since
      this layer's previous wave, one cycle ago (the layer's own keys of that wave are
      stale: in a cycle they come back last). Everything else is fresh.
    - Victims: unprotected stale keys by ascending stamp, then unprotected fresh keys by
      descending stamp (one total order: choosing n at once = choosing one by one).
    Prefill waves and multi-wave layers follow the same rules with their own notion of a
    step (the layer's previous wave may be an earlier wave of the same layer).

    Cost: O(1) per use; `victims` walks the stale prefix from the old end, then the fresh
    keys from the young end past the current wave's protected keys.
    """

    name: ClassVar[str] = "lru"

    def __init__(self) -> None:
        super().__init__()
        self._stamp: dict[Key, int] = {}  # resident key -> clock value of its last use
        self._clock = 0  # the next stamp
        self._wave_end: dict[int, int] = {}  # layer -> clock at the end of its last wave
        self._stale_before = 0  # the threshold of the wave being planned

    def insert(self, key: Key) -> None:
        super().insert(key)
        self._use(key)

    def touch(self, key: Key) -> None:
        super().touch(key)  # KeyError for an untracked key, before stamping
        self._use(key)

    def remove(self, key: Key) -> None:
        super().remove(key)
        del self._stamp[key]

    def begin_wave(self, layer: int) -> None:
        self._stale_before = self._wave_end.get(layer, 0)

    def end_wave(self, layer: int) -> None:
        self._wave_end[layer] = self._clock

    def victims(self, protected: Collection[Key], n: int) -> list[Key]:
        out: list[Key] = []
        if n <= 0:
            return out
        stamp, before = self._stamp, self._stale_before
        for key in self._order:  # oldest first: the stale keys are a prefix
            if stamp[key] >= before:
                break
            if key not in protected:
                out.append(key)
                if len(out) == n:
                    return out
        for key in reversed(self._order):  # then the fresh keys, newest first
            if stamp[key] < before:
                break
            if key not in protected:
                out.append(key)
                if len(out) == n:
                    return out
        raise _not_enough(n, len(out))

    def stamp(self, key: Key) -> int:
        """The clock value of resident `key`'s last use (its device recency). KeyError if absent."""
        return self._stamp[key]

    @property
    def clock(self) -> int:
        return self._clock

    def wave_end(self, layer: int) -> int:
        """The clock at the end of `layer`'s last wave (0: never planned)."""
        return self._wave_end.get(layer, 0)

    def _use(self, key: Key) -> None:
        self._stamp[key] = self._clock
        self._clock += 1


class LFUPolicy(EvictionPolicy):
    """Least frequently used first, with ageing; ties go to the least recently used.

    Why not LRU alone: in MoE some experts are persistently hot (a shared-ish expert,
    a domain's experts), and one long prefill chunk touching every expert of every
    layer would flush them under LRU. Counting uses keeps them.

    Rules (the reference model in tests/moe/test_policy.py restates them naively):
    - Every `insert`/`touch` adds 1 to the key's count and stamps it with a global
      tick (recency). Victims are the smallest (count, tick) among unprotected keys.
    - History: `remove` keeps the key's count in a ghost table, and `insert` resumes
      from it. Experts go in and out of the pool constantly (the pool is a fraction of
      L x E), so forgetting on eviction would make every newcomer count 1 and reduce
      LFU to "protect whoever stayed in"; the key space is small (L x E ints).
    - Ageing (LFU-Aging, Arlitt et al. 1999): after a use, if the mean count over
      resident keys reaches `max_average`, every count, resident and ghost, is halved
      (floor; ghosts at 0 are dropped). This bounds counts, lets a formerly hot expert
      become evictable once it cools, and scales with the pool size without a tuned
      time window. Halving keeps the order of counts (ties may form; recency breaks them).

    Cost: O(log n) per use through a heap of (count, tick, key) entries with lazy
    deletion (an entry is live iff its tick is the key's current tick); the heap is
    rebuilt when stale entries outnumber live ones and at each halving, O(n) every
    ~n uses.
    """

    name: ClassVar[str] = "lfu"

    def __init__(self, max_average: int = 16) -> None:
        if max_average < 1:
            raise ValueError(f"max_average must be >= 1, got {max_average}")
        self.max_average = max_average
        self._count: dict[Key, int] = {}  # resident key -> use count
        self._tick: dict[Key, int] = {}  # resident key -> tick of its last use
        self._ghost: dict[Key, int] = {}  # evicted key -> count it had (> 0)
        self._heap: list[tuple[int, int, Key]] = []  # (count, tick, key), lazily stale
        self._clock = 0
        self._total = 0  # sum of resident counts, for the ageing test

    def insert(self, key: Key) -> None:
        if key in self._count:
            raise ValueError(f"key {key} is already tracked")
        self._count[key] = self._ghost.pop(key, 0)
        self._total += self._count[key]
        self._use(key)

    def touch(self, key: Key) -> None:
        if key not in self._count:
            raise KeyError(key)
        self._use(key)

    def remove(self, key: Key) -> None:
        count = self._count.pop(key)
        del self._tick[key]
        self._total -= count
        if count > 0:
            self._ghost[key] = count
        # Its heap entry is now stale (no tick); it is dropped when reached.

    def victims(self, protected: Collection[Key], n: int) -> list[Key]:
        out: list[Key] = []
        if n <= 0:
            return out
        heap, popped = self._heap, []
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            if self._tick.get(entry[2]) != entry[1]:
                continue  # stale: the key was used again or removed since
            popped.append(entry)
            if entry[2] not in protected:
                out.append(entry[2])
        # victims() only names keys; live entries go back so the heap stays complete.
        for entry in popped:
            heapq.heappush(heap, entry)
        if len(out) < n:
            raise _not_enough(n, len(out))
        return out

    def keys(self) -> Iterator[Key]:
        return iter(self._count)

    def count(self, key: Key) -> int:
        """Current (aged) use count of `key`, resident or ghost; 0 if unknown."""
        return self._count.get(key, self._ghost.get(key, 0))

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, key: object) -> bool:
        return key in self._count

    def _use(self, key: Key) -> None:
        self._clock += 1
        self._count[key] += 1
        self._tick[key] = self._clock
        self._total += 1
        heapq.heappush(self._heap, (self._count[key], self._clock, key))
        if self._total >= self.max_average * len(self._count):
            self._halve()
        elif len(self._heap) > 2 * len(self._count) + 64:
            self._rebuild_heap()

    def _halve(self) -> None:
        for key in self._count:
            self._count[key] //= 2
        self._total = sum(self._count.values())
        self._ghost = {k: c // 2 for k, c in self._ghost.items() if c >= 2}
        self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = [(c, self._tick[k], k) for k, c in self._count.items()]
        heapq.heapify(self._heap)


_POLICIES: dict[str, type[EvictionPolicy]] = {p.name: p for p in (ScanLRUPolicy, LRUPolicy, LFUPolicy)}


def available_policies() -> tuple[str, ...]:
    """Names accepted by `make_policy` (the `--moe-policy` choices)."""
    return tuple(_POLICIES)


def make_policy(name: str, **options: int) -> EvictionPolicy:
    """A fresh, empty policy by name: "lru" (scan-resistant, default), "lru-plain" or "lfu".

    `options` go to the policy's constructor (e.g. `max_average` for "lfu").
    """
    try:
        cls = _POLICIES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; choose from {available_policies()}") from None
    return cls(**options)
