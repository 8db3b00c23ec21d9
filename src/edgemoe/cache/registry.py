"""Prefix caches by name (`--cache-type`), imported lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemoe.cache.prefix_cache import NoPrefixCache, PagePool, PrefixCache

if TYPE_CHECKING:
    from edgemoe.cache.host_tier import HostTier
    from edgemoe.cache.state_pool import StatePool

CACHE_TYPES = ("radix", "none")


def make_prefix_cache(
    cache_type: str, pool: PagePool, states: StatePool | None = None, host: HostTier | None = None
) -> PrefixCache:
    """The prefix cache named by `--cache-type`, over `pool`'s pages; with GDN `states`
    (hybrid models) or a host tier, the radix tree that keeps snapshots / spills to it."""
    if cache_type == "none":
        if host is not None:
            raise ValueError("host_cache (--host-cache) needs the prefix cache: --cache-type radix")
        return NoPrefixCache(pool.page_size)
    if cache_type == "radix" and (states is not None or host is not None):
        from edgemoe.cache.kv_pool import KVPool
        from edgemoe.cache.tiered_radix import TieredRadixCache

        assert isinstance(pool, KVPool)
        return TieredRadixCache(pool.page_size, pool, states, host)
    if cache_type == "radix":
        from edgemoe.cache.radix import RadixPrefixCache

        return RadixPrefixCache(pool.page_size, pool)
    raise ValueError(f"unknown cache type {cache_type!r}; choose from {', '.join(CACHE_TYPES)}")
