"""RadixPrefixCache on hand-worked scenarios (the randomised comparison is in
test_radix_model.py). Expected pages are worked out by hand from the KV pool's
allocation order (low ids first)."""

from __future__ import annotations

import pytest
import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.prefix_cache import StaleHandle
from edgemoe.cache.radix import RadixPrefixCache


def make(page_size: int, num_pages: int = 16) -> tuple[KVPool, RadixPrefixCache]:
    pool = KVPool(1, num_pages, page_size, 1, 2, torch.float32, torch.device("cpu"))
    return pool, RadixPrefixCache(page_size, pool)


def run(pool: KVPool, cache: RadixPrefixCache, tokens: list[int]) -> list[int]:
    """One request's whole life: match, lock, allocate, insert, free, unlock.

    Returns the page table it ran with."""
    m = cache.match(tokens)
    cache.lock(m.handle)
    table = m.pages + pool.alloc(pool.pages_for(len(tokens)) - len(m.pages))
    r = cache.insert(tokens, table)
    pool.free(r.to_free)
    cache.unlock(m.handle)
    return table


def test_empty_cache_matches_nothing() -> None:
    _, cache = make(2)
    m = cache.match([1, 2, 3, 4])
    assert (m.num_tokens, m.pages) == (0, [])
    cache.lock(m.handle)  # the empty prefix can be locked like any other
    cache.unlock(m.handle)
    assert cache.total_pages == cache.evictable_pages == 0


def test_match_is_page_granular_and_partial_tail_is_returned() -> None:
    pool, cache = make(2)
    table = pool.alloc(4)  # 7 tokens: 3 full pages + a partial one
    r = cache.insert([1, 2, 3, 4, 5, 6, 7], table)
    assert (r.num_tokens, r.num_new_pages, r.to_free) == (6, 3, [table[3]])
    assert cache.match([1, 2, 3, 9]).pages == table[:1]  # diverges inside page 2
    assert cache.match([1, 2, 3, 4, 5]).pages == table[:2]  # page 3 incomplete
    m = cache.match([1, 2, 3, 4, 5, 6, 7, 8])
    assert (m.num_tokens, m.pages) == (6, table[:3])


def test_duplicate_pages_go_back_to_the_caller() -> None:
    pool, cache = make(2)
    first = pool.alloc(2)
    second = pool.alloc(3)  # same prompt computed privately, plus one more page
    cache.insert([5, 6, 7, 8], first)
    r = cache.insert([5, 6, 7, 8, 9, 9], second)
    assert (r.num_new_pages, r.to_free) == (1, second[:2])
    assert cache.match([5, 6, 7, 8, 9, 9]).pages == first + second[2:]
    assert cache.total_pages == 3


def test_pages_shared_through_match_are_not_returned() -> None:
    pool, cache = make(1)
    run(pool, cache, [1, 2, 3])
    table = run(pool, cache, [1, 2, 3, 4])  # reuses three pages, computes one
    assert cache.total_pages == 4 and pool.num_free == 12
    assert cache.match([1, 2, 3, 4]).pages == table


def test_divergence_inside_an_edge_splits_it() -> None:
    pool, cache = make(2)
    a = run(pool, cache, [1, 2, 3, 4, 5, 6])
    b = run(pool, cache, [1, 2, 3, 4, 7, 8])
    assert b[:2] == a[:2]
    assert cache.match([1, 2, 3, 4, 5, 6]).pages == a
    assert cache.match([1, 2, 3, 4, 7, 8]).pages == b
    assert cache.total_pages == 4


def test_locked_prefix_survives_eviction() -> None:
    pool, cache = make(2)
    run(pool, cache, [1, 1, 2, 2, 3, 3])
    run(pool, cache, [4, 4, 5, 5])
    m = cache.match([1, 1, 2, 2])  # splits [1 1 2 2 | 3 3]
    cache.lock(m.handle)
    assert cache.evictable_pages == 3
    assert cache.evict(10) == 3  # [3 3] and the whole [4 4 5 5] branch
    assert pool.num_free == 14
    assert cache.match([1, 1, 2, 2, 3, 3]).pages == m.pages
    cache.unlock(m.handle)
    assert cache.evict(10) == 2 and cache.total_pages == 0 and pool.num_free == 16


def test_eviction_is_lru_over_leaves_and_frees_from_the_tail() -> None:
    pool, cache = make(1)
    x = run(pool, cache, [1, 2, 3])
    y = run(pool, cache, [7, 8])
    cache.match([1, 2, 3])  # x is now more recent than y
    assert cache.evict(1) == 1
    assert cache.match([7, 8]).pages == y[:1]  # y's tail went first
    assert cache.match([1, 2, 3]).pages == x  # (this match makes x recent again)
    assert cache.evict(2) == 2  # y's head, then x's tail
    assert cache.match([1, 2, 3]).pages == x[:2]


def test_trimmed_leaf_keeps_its_place_in_lru_order() -> None:
    pool, cache = make(1)
    run(pool, cache, [5, 5])
    held = cache.match([5, 5])
    cache.lock(held.handle)  # [5 5] is the oldest leaf but locked
    run(pool, cache, [1, 2, 3])
    assert cache.evict(1) == 1  # trims [1 2 3] to [1 2]
    cache.unlock(held.handle)
    assert cache.evict(2) == 2  # [5 5] was used before [1 2]: it goes first
    assert cache.match([1, 2]).num_tokens == 2
    assert cache.match([5, 5]).num_tokens == 0


def test_evict_frees_exactly_what_is_asked() -> None:
    pool, cache = make(4)
    table = pool.alloc(4)
    cache.insert(list(range(16)), table)
    assert cache.evict(0) == 0
    assert cache.evict(3) == 3
    assert cache.match(list(range(16))).pages == table[:1]
    assert cache.evict(5) == 1


def test_handle_survives_a_split_and_unlocks_the_whole_path() -> None:
    pool, cache = make(1)
    run(pool, cache, [1, 2, 3, 4])
    m = cache.match([1, 2, 3, 4])
    cache.lock(m.handle)
    cache.match([1, 2])  # splits the locked node
    run(pool, cache, [1, 2, 9])
    assert cache.evictable_pages == 1
    cache.unlock(m.handle)
    assert cache.evictable_pages == 5


def test_unlocked_handle_goes_stale_after_eviction() -> None:
    pool, cache = make(2)
    run(pool, cache, [1, 2, 3, 4])
    m = cache.match([1, 2, 3, 4])
    cache.evict(1)
    with pytest.raises(StaleHandle):
        cache.lock(m.handle)
    short = cache.match([1, 2, 3, 4])  # match again: the surviving page
    cache.lock(short.handle)
    cache.unlock(short.handle)


def test_misuse_raises() -> None:
    pool, cache = make(2)
    table = run(pool, cache, [1, 2, 3, 4])
    m = cache.match([1, 2])
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(m.handle)
    with pytest.raises(ValueError, match="another position"):
        cache.insert([9, 9, 8, 8], [table[1], table[0]])
    with pytest.raises(ValueError, match="cannot hold"):
        cache.insert([1, 2, 3, 4], table[:1])
    with pytest.raises(ValueError, match="twice"):
        cache.insert([7, 7, 7, 7], [20, 20])
    with pytest.raises(ValueError, match="handle"):
        cache.lock(object())
    with pytest.raises(ValueError, match="page_size"):
        RadixPrefixCache(4, pool)


def test_reset_frees_everything_unless_locked() -> None:
    pool, cache = make(2)
    run(pool, cache, [1, 2, 3, 4, 5, 6])
    m = cache.match([1, 2])
    cache.lock(m.handle)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.unlock(m.handle)
    cache.reset()
    assert (cache.total_pages, pool.num_free, cache.queries) == (0, 16, 0)
    with pytest.raises(StaleHandle):
        cache.lock(m.handle)


def test_stats_count_queried_and_hit_tokens() -> None:
    pool, cache = make(2)
    run(pool, cache, [1, 2, 3, 4, 5])  # a query of 5 tokens, no hit
    cache.match([1, 2, 3, 4, 5, 6])  # 4 of 6 tokens hit
    cache.match([1, 2, 3, 4], record=False)
    assert (cache.queries, cache.query_tokens, cache.hit_tokens) == (2, 11, 4)
    assert cache.hit_rate == pytest.approx(4 / 11)  # one float64 division each side
