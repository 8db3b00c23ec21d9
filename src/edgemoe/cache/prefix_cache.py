"""The prefix-cache interface: reuse the KV pages of a previously seen token prefix.

Agents resend the whole conversation every turn; a prefix cache keeps the KV pages of
finished requests so the next turn prefills only what is new. This module holds the
contract (`PrefixCache`), the result types, the do-nothing implementation
(`NoPrefixCache`, `--cache-type none`) and the factory. The radix tree lives in
`cache/radix.py`.

Page ownership (NOTE: the invariant every implementation and caller keeps):

Every page id of the KV pool is owned by exactly one of
1. the pool's free list;
2. the prefix cache (`total_pages` of them). Tree pages are always full pages and
   read-only: any number of running requests may *share* them (through `match`), but
   nobody writes into them and only the cache itself ever frees them (`evict`,
   `reset`);
3. one running request, privately: the pages it allocated itself after its match
   (its computed full pages not yet inserted, and its partially filled tail page).

Transitions: pool → request (`pool.alloc`); request → cache (`insert` adopts pages);
request → pool (the caller frees `InsertResult.to_free` after `insert`, or all of its
private pages if it never inserts); cache → pool (`evict` of unlocked pages, `reset`).
A caller never frees a page it got from `match`.

Recurrent state (hybrid models, a cache whose `stateful` is True): KV pages alone do
not let a request skip a prefix, since its GDN layers need their state after it. Such a
cache keeps *snapshots* (a copy of a sequence's state at a page boundary, in a snapshot
row of the state pool) on its tree: a match ends at the deepest prefix with a snapshot,
`restore_state` copies it into the request's live row, the running request captures its
own (`capture_state` at page boundaries, `freeze_state` to keep one) and donates them with
its pages (`insert(..., snapshots=)`). Snapshot rows have one owner each, like pages:
the state pool's free list, the cache, or one running request (its `Snapshot` list).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class PagePool(Protocol):
    """What a prefix cache needs from the KV pool: the page size and a way to give pages back."""

    page_size: int

    def free(self, pages: list[int]) -> None: ...


ROLLING = "rolling"


@dataclass
class Snapshot:
    """A running request's copy of its GDN state after `num_tokens` tokens (a multiple of
    the page size), in state-pool row `row`. The rolling one moves forward with the
    request; a frozen one (`kind` names why: the prompt's end, a tool-call opener) stays
    until the request donates it."""

    num_tokens: int
    row: int
    kind: str = ROLLING


class PrefixMatch(NamedTuple):
    """The longest cached prefix of a query, at page granularity.

    `pages[i]` holds the KV of tokens `[i * page_size, (i + 1) * page_size)`; the pages
    are owned by the cache and valid only while `handle` is locked.
    """

    num_tokens: int  # matched tokens, a multiple of page_size; == len(pages) * page_size
    pages: list[int]  # a fresh list: the caller may extend it into its page table
    handle: object  # opaque; pass to lock / unlock / never inspect
    state_row: int | None = None  # stateful caches: the snapshot row at num_tokens (restore_state)


class InsertResult(NamedTuple):
    """What `insert` did with the caller's pages."""

    num_tokens: int  # tokens of the inserted sequence now cached (full pages only)
    num_new_pages: int  # caller pages the cache adopted (now owned by the cache)
    to_free: list[int]  # caller pages the cache did not take: the caller must free them


class StaleHandle(ValueError):
    """`lock` of a handle whose node was evicted (or reset) since `match` returned it."""


class PrefixCache(ABC):
    """A cache of KV pages keyed by the token prefix they encode.

    Usage by the engine (one request's life):
    1. Admission: `m = cache.match(prompt_ids[:-1])`, then `cache.lock(m.handle)`
       BEFORE any `evict` and before the pages are used. The request's page table starts
       with `m.pages` (shared, copy-free) and it computes tokens from `m.num_tokens` on.
    2. Running short of pages: `cache.evict(n)` before refusing or preempting anyone.
    3. Finish, abort or preemption, while the match is still locked:
       `r = cache.insert(computed_ids, page_table)`; `pool.free(r.to_free)`;
       `cache.unlock(m.handle)`.

    Handles: `match` returns a handle naming the matched prefix. A locked handle
    guarantees that its pages stay in the cache, unchanged, and are never evicted or
    freed, and that the same holds for every shorter prefix of it. Locks are reference
    counts: several requests may lock the same handle; each `lock` is paired with exactly
    one `unlock`. An unlocked handle may go stale at the next `evict`; `lock` then raises
    `StaleHandle` (match again).

    Lifetime: one cache per KV pool, created empty, living as long as the pool.
    Locking: none; not thread-safe. The engine loop owns the cache and the pool and
    serialises every call.
    """

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        # Counters for the engine stats; `reset` zeroes them.
        self.queries = 0
        self.query_tokens = 0
        self.hit_tokens = 0

    @abstractmethod
    def match(self, token_ids: Sequence[int], *, record: bool = True) -> PrefixMatch:
        """The longest cached prefix of `token_ids` made of whole pages.

        Counts as an access of the matched prefix (LRU). Does not lock. With `record`
        the call counts in `queries`/`query_tokens`/`hit_tokens`; a scheduler that
        retries admission of the same request passes `record=False` on retries.
        NOTE: a request needs logits for its last prompt token, so it matches
        `prompt_ids[:-1]`: at least one token is always computed, and it never writes
        into a shared (tree) page.
        """

    @abstractmethod
    def lock(self, handle: object) -> None:
        """Protect the handle's prefix from eviction until the paired `unlock`.

        Raises `StaleHandle` if the handle's prefix was evicted since `match`.
        """

    @abstractmethod
    def unlock(self, handle: object) -> None:
        """Release one `lock` of `handle`. Raises ValueError if it is not locked."""

    @abstractmethod
    def insert(
        self, token_ids: Sequence[int], pages: Sequence[int], snapshots: Sequence[Snapshot] = ()
    ) -> InsertResult:
        """Offer a request's pages to the cache; report which ones the caller must free.

        `token_ids` are the tokens whose KV has been computed (for a finished request:
        prompt + output[:-1], since the last sampled token never went through the
        model), and they include at least the request's matched prefix (its KV counts as
        computed from admission on); `pages` is the request's page table,
        `len(pages) >= len(token_ids) // page_size`. Only the first `len(token_ids) // page_size` (full) pages are
        cacheable. For each of them, at its position:
        - the cache already holds that prefix with the same page (the page came from
          `match`): nothing changes, the page stays the cache's;
        - the cache already holds that prefix with another page: the caller's page is
          a duplicate and goes to `to_free`;
        - the cache lacks that prefix: the cache adopts the page.
        Pages past the full ones (the partial tail, spare pages) go to `to_free`.
        Afterwards every page of `pages` is owned by the cache or listed in `to_free`,
        in page-table order. Counts as an access of the whole inserted prefix (LRU).
        Call it while the request's own match is still locked.
        Raises ValueError if `pages` is too short, or names a cache page at a position
        where the cache does not hold it (a double owner).
        `snapshots` (stateful caches; empty otherwise): the request's state snapshots,
        whose rows the cache takes over (keeping or freeing each).
        """

    @abstractmethod
    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` unlocked pages to the pool, least recently used first.

        Only pages with no cached continuation (leaves) go, so a prefix shrinks from its
        end; a locked prefix is never touched. Returns the number of pages freed:
        `min(num_pages, evictable_pages)`.
        """

    @abstractmethod
    def reset(self) -> None:
        """Free every cached page to the pool and zero the counters.

        Raises RuntimeError while any handle is locked (pages still in use).
        """

    @property
    @abstractmethod
    def total_pages(self) -> int:
        """Pages owned by the cache."""

    @property
    @abstractmethod
    def evictable_pages(self) -> int:
        """Pages owned by the cache that no lock protects (what `evict` could free now)."""

    # -- recurrent state (hybrid models); a cache that keeps none inherits these ---------------

    @property
    def stateful(self) -> bool:
        """Whether matches are cut back to GDN state snapshots (hybrid models)."""
        return False

    def restore_state(self, match: PrefixMatch, row: int) -> None:
        """Copy `match`'s snapshot into the live state row `row` (call while its handle is
        locked, before the request's first step)."""

    def capture_state(self, held: list[Snapshot], row: int, num_tokens: int) -> None:
        """After a step: live row `row` holds the state after `num_tokens` tokens; keep it
        in the request's rolling snapshot (`held`) if that is a page boundary."""

    def freeze_state(self, held: list[Snapshot], kind: str) -> None:
        """Keep the request's rolling snapshot until it donates it, as the one of `kind`
        (replacing an earlier one of that kind)."""

    def tier_stats(self) -> dict[str, int]:
        """Counts of what the cache keeps beyond device KV pages (snapshots, host tier)."""
        return {}

    @property
    def hit_rate(self) -> float:
        """Share of queried tokens served from the cache."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def record_query(self, query_tokens: int, hit_tokens: int) -> None:
        """Count one lookup (for callers that matched with `record=False`)."""
        self.queries += 1
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens


class _NoHandle:
    """The handle of `NoPrefixCache`: always the empty prefix."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_HANDLE"


NO_HANDLE = _NoHandle()


class NoPrefixCache(PrefixCache):
    """`--cache-type none`: never matches, owns nothing, hands every page back on insert."""

    def match(self, token_ids: Sequence[int], *, record: bool = True) -> PrefixMatch:
        if record:
            self.record_query(len(token_ids), 0)
        return PrefixMatch(0, [], NO_HANDLE)

    def lock(self, handle: object) -> None:
        _check_no_handle(handle)

    def unlock(self, handle: object) -> None:
        _check_no_handle(handle)

    def insert(
        self, token_ids: Sequence[int], pages: Sequence[int], snapshots: Sequence[Snapshot] = ()
    ) -> InsertResult:
        _check_no_snapshots(snapshots)
        if len(pages) < len(token_ids) // self.page_size:
            raise ValueError(f"{len(pages)} pages cannot hold {len(token_ids)} tokens")
        return InsertResult(0, 0, list(pages))

    def evict(self, num_pages: int) -> int:
        return 0

    def reset(self) -> None:
        self.queries = self.query_tokens = self.hit_tokens = 0

    @property
    def total_pages(self) -> int:
        return 0

    @property
    def evictable_pages(self) -> int:
        return 0


def _check_no_snapshots(snapshots: Sequence[Snapshot]) -> None:
    if snapshots:
        raise ValueError("this prefix cache keeps no state snapshots (it is not stateful)")


def _check_no_handle(handle: object) -> None:
    if handle is not NO_HANDLE:
        raise ValueError(f"not a NoPrefixCache handle: {handle!r}")
