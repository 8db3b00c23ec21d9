"""KV cache: the paged pool, the prefix cache over its pages, GDN state rows (and their
snapshots in the prefix tree), and the host tier under it."""

from edgemoe.cache.kv_pool import KVPool, OutOfPages
from edgemoe.cache.page_table import PageTable
from edgemoe.cache.prefix_cache import NoPrefixCache, PrefixCache, PrefixMatch, Snapshot
from edgemoe.cache.registry import make_prefix_cache
from edgemoe.cache.state_pool import StatePool, StateShape

__all__ = [
    "KVPool", "NoPrefixCache", "OutOfPages", "PageTable", "PrefixCache", "PrefixMatch", "Snapshot", "StatePool",
    "StateShape", "make_prefix_cache",
]
