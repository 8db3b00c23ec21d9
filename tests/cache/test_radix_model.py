"""RadixPrefixCache against a plain reference model, driven like the engine drives it.

The reference keeps one dict entry per cached page: the full-page token prefix that ends
with that page -> page id, with an explicit lock count and last-access stamp per entry.
Matching walks prefixes one page at a time; eviction repeatedly removes the unlocked
entry with no cached continuation and the oldest stamp. Every page id of a real KVPool
is tracked: at every step it has exactly one owner among the pool's free list, the
cache, and the simulated running requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.prefix_cache import StaleHandle
from edgemoe.cache.radix import RadixPrefixCache

Tokens = tuple[int, ...]


class CheckedPool(KVPool):
    """A real (tiny) KVPool that also fails on a double free or a double alloc."""

    def __init__(self, page_size: int, num_pages: int) -> None:
        super().__init__(1, num_pages, page_size, 1, 2, torch.float32, torch.device("cpu"))
        self.free_set: set[int] = set(range(num_pages))
        self.freed_log: list[int] = []

    def alloc(self, n: int) -> list[int]:
        pages = super().alloc(n)
        assert self.free_set.issuperset(pages), f"allocated a page that was not free: {pages}"
        self.free_set.difference_update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        assert len(set(pages)) == len(pages), f"page freed twice in one call: {pages}"
        twice = self.free_set.intersection(pages)
        assert not twice, f"double free of {sorted(twice)}"
        self.free_set.update(pages)
        self.freed_log.extend(pages)
        super().free(pages)


class RefCache:
    """The prefix cache the slow, obvious way (see the module docstring)."""

    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.page: dict[Tokens, int] = {}
        self.locks: dict[Tokens, int] = {}
        self.stamp: dict[Tokens, int] = {}
        self.clock = 0
        self.queries = self.query_tokens = self.hit_tokens = 0

    def _keys(self, tokens: Tokens) -> list[Tokens]:
        return [tokens[: k * self.ps] for k in range(1, len(tokens) // self.ps + 1)]

    def match(self, tokens: Tokens, record: bool) -> tuple[int, list[int], Tokens]:
        self.clock += 1
        matched: list[Tokens] = []
        for key in self._keys(tokens):
            if key not in self.page:
                break
            matched.append(key)
            self.stamp[key] = self.clock
        if record:
            self.queries += 1
            self.query_tokens += len(tokens)
            self.hit_tokens += len(matched) * self.ps
        handle = matched[-1] if matched else ()
        return len(matched) * self.ps, [self.page[k] for k in matched], handle

    def lock(self, handle: Tokens, delta: int = 1) -> None:
        for key in self._keys(handle):
            self.locks[key] += delta
            assert self.locks[key] >= 0

    def insert(self, tokens: Tokens, pages: list[int]) -> tuple[int, int, list[int]]:
        self.clock += 1
        to_free: list[int] = []
        new = 0
        keys = self._keys(tokens)
        for key, mine in zip(keys, pages):
            if key in self.page:
                if self.page[key] != mine:
                    to_free.append(mine)
            else:
                self.page[key], self.locks[key] = mine, 0
                new += 1
            self.stamp[key] = self.clock
        return len(keys) * self.ps, new, to_free + pages[len(keys) :]

    def _has_child(self, key: Tokens) -> bool:
        return any(len(k) == len(key) + self.ps and k[: len(key)] == key for k in self.page)

    def evict(self, n: int) -> dict[Tokens, int]:
        """Evict up to n pages; return what went, prefix -> page."""
        gone: dict[Tokens, int] = {}
        for _ in range(n):
            leaves = [k for k in self.page if self.locks[k] == 0 and not self._has_child(k)]
            if not leaves:
                break
            victim = min(leaves, key=lambda k: self.stamp[k])
            ties = [k for k in leaves if self.stamp[k] == self.stamp[victim]]
            assert len(ties) == 1, f"LRU tie between leaves {ties}: order would be ambiguous"
            gone[victim] = self.page.pop(victim)
            del self.locks[victim], self.stamp[victim]
        return gone


@dataclass
class Req:
    """A simulated running request: its token ids and page table."""

    tokens: Tokens
    table: list[int]
    private: list[int]  # pages it allocated itself (owned by it until insert/free)
    shared: list[int]  # pages from its match (owned by the cache, locked)
    handle: object | None  # tree handle, locked; None when admitted without the cache
    ref_handle: Tokens = ()


@dataclass
class Loose:
    """A matched but unlocked handle, or a locked one held without a request."""

    handle: object
    ref_handle: Tokens
    stale: bool = False
    locked: bool = False
    pages: list[int] = field(default_factory=list)


# Three base sequences so that prompts share long prefixes and diverge mid-page.
BASES = [(1, 2) * 12, (1, 2, 3) * 8, (3,) * 24]
TAIL = st.lists(st.integers(0, 3), max_size=6)
TOKENS = st.one_of(
    st.builds(lambda b, n, t: b[:n] + tuple(t), st.sampled_from(BASES), st.integers(0, 24), TAIL),
    st.lists(st.integers(0, 1), max_size=12).map(tuple),
)


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.ps = page_size
        self.pool = CheckedPool(page_size, 48 // page_size)
        self.cache = RadixPrefixCache(page_size, self.pool)
        self.ref = RefCache(page_size)
        self.reqs: list[Req] = []
        self.loose: list[Loose] = []
        self.history: list[Tokens] = []  # inserted sequences: an agent's next turn extends one

    # -- helpers -----------------------------------------------------------------------

    def _match(self, tokens: Tokens, record: bool = True) -> Loose:
        m = self.cache.match(tokens, record=record)
        num, pages, ref_handle = self.ref.match(tokens, record)
        assert (m.num_tokens, m.pages) == (num, pages)
        return Loose(m.handle, ref_handle, pages=pages)

    def _evict(self, n: int) -> None:
        self.pool.freed_log.clear()
        freed = self.cache.evict(n)
        gone = self.ref.evict(n)
        assert freed == len(gone) == len(self.pool.freed_log)
        assert set(self.pool.freed_log) == set(gone.values())
        event(f"evict freed {'none' if not freed else 'some' if freed < n else 'all asked'}")
        for lo in self.loose:
            lo.stale |= lo.ref_handle in gone

    def _alloc(self, n: int) -> list[int] | None:
        if self.pool.num_free < n:
            self._evict(n - self.pool.num_free)
        return self.pool.alloc(n) if self.pool.num_free >= n else None

    # -- rules -------------------------------------------------------------------------

    def _next_turn(self, data: st.DataObject) -> Tokens:
        """A previously inserted sequence, maybe cut, plus new tokens."""
        old = data.draw(st.sampled_from(self.history))
        cut = data.draw(st.sampled_from([len(old), len(old) - 1, len(old) // 2]))
        return old[:cut] + tuple(data.draw(TAIL))

    @rule(tokens=TOKENS, use_cache=st.booleans())
    def admit(self, tokens: Tokens, use_cache: bool) -> None:
        self._admit(tokens, use_cache)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def admit_next_turn(self, data: st.DataObject) -> None:
        self._admit(self._next_turn(data), use_cache=True)

    def _admit(self, tokens: Tokens, use_cache: bool) -> None:
        """Engine admission: match + lock (before any eviction), allocate the rest."""
        lo = self._match(tokens) if use_cache else None
        if lo is not None:
            self.cache.lock(lo.handle)
            self.ref.lock(lo.ref_handle)
        shared = lo.pages if lo is not None else []
        private = self._alloc(self.pool.pages_for(len(tokens)) - len(shared))
        event(f"admit: {'hit' if shared else 'miss'}")
        if private is None:  # refused: not enough pages even after eviction
            event("admit: refused")
            if lo is not None:
                self.cache.unlock(lo.handle)
                self.ref.lock(lo.ref_handle, -1)
            return
        handle = lo.handle if lo is not None else None
        ref_handle = lo.ref_handle if lo is not None else ()
        self.reqs.append(Req(tokens, shared + private, private, shared, handle, ref_handle))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """Decode a few tokens, then insert the computed prefix (finish or abort)."""
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        out = tuple(data.draw(st.lists(st.integers(0, 3), max_size=5)))
        grow = self.pool.pages_for(len(req.tokens) + len(out)) - len(req.table)
        extra = self._alloc(max(0, grow))
        if extra is None:
            out = ()
        else:
            req.table += extra
            req.private += extra
        full = req.tokens + out
        # The KV of the matched prefix counts as computed from admission on.
        computed = full[: data.draw(st.integers(len(req.shared) * self.ps, len(full)))]
        r = self.cache.insert(computed, req.table)
        assert tuple(r) == self.ref.insert(computed, req.table)
        dup = len(r.to_free) > len(req.table) - len(computed) // self.ps
        event(f"insert: {'duplicates' if dup else 'no duplicates'}")
        assert set(r.to_free) <= set(req.private), "caller told to free a page it does not own"
        self.pool.free(r.to_free)
        if computed:
            self.history.append(computed)
        if req.handle is not None:
            self.cache.unlock(req.handle)
            self.ref.lock(req.ref_handle, -1)

    @rule(tokens=TOKENS, record=st.booleans())
    def match_only(self, tokens: Tokens, record: bool) -> None:
        self.loose.append(self._match(tokens, record))

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def match_next_turn(self, data: st.DataObject) -> None:
        self.loose.append(self._match(self._next_turn(data)))

    @precondition(lambda self: any(not lo.locked for lo in self.loose))
    @rule(data=st.data())
    def lock_loose(self, data: st.DataObject) -> None:
        lo = data.draw(st.sampled_from([lo for lo in self.loose if not lo.locked]))
        event(f"lock loose handle: {'stale' if lo.stale else 'live'}")
        if lo.stale:
            with pytest.raises(StaleHandle):
                self.cache.lock(lo.handle)
            self.loose.remove(lo)
            return
        self.cache.lock(lo.handle)
        self.ref.lock(lo.ref_handle)
        lo.locked = True

    @precondition(lambda self: any(lo.locked for lo in self.loose))
    @rule(data=st.data())
    def unlock_loose(self, data: st.DataObject) -> None:
        lo = data.draw(st.sampled_from([lo for lo in self.loose if lo.locked]))
        self.cache.unlock(lo.handle)
        self.ref.lock(lo.ref_handle, -1)
        self.loose.remove(lo)

    @rule(n=st.integers(0, 20))
    def evict(self, n: int) -> None:
        self._evict(n)

    @precondition(lambda self: not self.reqs and not any(lo.locked for lo in self.loose))
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.ref = RefCache(self.ps)
        for lo in self.loose:
            lo.stale = True  # reset invalidates every handle, the empty prefix's too

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def pages_have_one_owner(self) -> None:
        held = [p for req in self.reqs for p in req.private]
        tree = list(self.ref.page.values())
        owners = [*self.pool.free_set, *held, *tree]
        assert sorted(owners) == list(range(self.pool.num_pages)), "page leaked or owned twice"
        assert self.pool.num_free == len(self.pool.free_set)
        assert self.cache.total_pages == len(tree)
        assert self.cache.total_pages + self.pool.num_free + len(held) == self.pool.num_pages

    @invariant()
    def locked_pages_stay_cached(self) -> None:
        tree = set(self.ref.page.values())
        locked = [req.shared for req in self.reqs] + [lo.pages for lo in self.loose if lo.locked]
        for pages in locked:
            assert tree.issuperset(pages)

    @invariant()
    def counts_agree(self) -> None:
        assert self.cache.evictable_pages == sum(1 for n in self.ref.locks.values() if n == 0)
        assert (self.cache.queries, self.cache.query_tokens, self.cache.hit_tokens) == (
            self.ref.queries, self.ref.query_tokens, self.ref.hit_tokens)  # fmt: skip

    @invariant()
    def reference_is_prefix_closed(self) -> None:
        for key in self.ref.page:
            assert len(key) == self.ps or key[: -self.ps] in self.ref.page


RadixMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
TestRadixAgainstReference = RadixMachine.TestCase
