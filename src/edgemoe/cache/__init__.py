"""KV cache: the paged pool and the prefix cache over its pages (later: GDN state
snapshots and a host tier)."""

from edgemoe.cache.kv_pool import KVPool, OutOfPages
from edgemoe.cache.page_table import PageTable
from edgemoe.cache.prefix_cache import NoPrefixCache, PrefixCache, PrefixMatch
from edgemoe.cache.registry import make_prefix_cache

__all__ = [
    "KVPool", "NoPrefixCache", "OutOfPages", "PageTable", "PrefixCache", "PrefixMatch", "make_prefix_cache",
]
