"""The prefix-cache interface: `NoPrefixCache` and the `--cache-type` factory."""

from __future__ import annotations

import pytest
import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.prefix_cache import (
    NoPrefixCache,
    PrefixCache,
)
from edgemoe.cache.radix import RadixPrefixCache
from edgemoe.cache.registry import make_prefix_cache


def tiny_pool(page_size: int = 2) -> KVPool:
    return KVPool(1, 8, page_size, 1, 2, torch.float32, torch.device("cpu"))


def test_no_cache_never_matches_and_hands_every_page_back() -> None:
    pool = tiny_pool()
    cache = make_prefix_cache("none", pool)
    assert isinstance(cache, NoPrefixCache)
    m = cache.match([1, 2, 3, 4])
    assert (m.num_tokens, m.pages) == (0, [])
    cache.lock(m.handle)
    table = pool.alloc(3)
    r = cache.insert([1, 2, 3, 4, 5], table)
    assert (r.num_tokens, r.num_new_pages, r.to_free) == (0, 0, table)
    pool.free(r.to_free)
    cache.unlock(m.handle)
    assert (cache.evict(8), cache.total_pages, cache.evictable_pages, pool.num_free) == (0, 0, 0, 8)
    assert (cache.queries, cache.query_tokens, cache.hit_tokens, cache.hit_rate) == (1, 4, 0, 0.0)
    cache.reset()
    assert cache.queries == 0


def test_no_cache_rejects_foreign_handles_and_short_tables() -> None:
    cache = NoPrefixCache(2)
    with pytest.raises(ValueError):
        cache.lock(object())
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4], [0])


def test_factory_builds_radix_over_the_pool_page_size() -> None:
    cache = make_prefix_cache("radix", tiny_pool(4))
    assert isinstance(cache, RadixPrefixCache) and isinstance(cache, PrefixCache)
    assert cache.page_size == 4
    with pytest.raises(ValueError, match="unknown cache type"):
        make_prefix_cache("lru", tiny_pool())
    with pytest.raises(ValueError, match="page_size"):
        NoPrefixCache(0)
