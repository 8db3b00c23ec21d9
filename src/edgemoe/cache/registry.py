"""Prefix caches by name (`--cache-type`), imported lazily."""

from __future__ import annotations

from edgemoe.cache.prefix_cache import NoPrefixCache, PagePool, PrefixCache

CACHE_TYPES = ("radix", "none")


def make_prefix_cache(cache_type: str, pool: PagePool) -> PrefixCache:
    """The prefix cache named by `--cache-type`, over `pool`'s pages."""
    if cache_type == "none":
        return NoPrefixCache(pool.page_size)
    if cache_type == "radix":
        from edgemoe.cache.radix import RadixPrefixCache

        return RadixPrefixCache(pool.page_size, pool)
    raise ValueError(f"unknown cache type {cache_type!r}; choose from {', '.join(CACHE_TYPES)}")
