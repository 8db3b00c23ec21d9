"""KV cache: the paged pool and the prefix cache over its pages (later: GDN state
snapshots and a host tier)."""

from edgemoe.cache.kv_pool import KVPool, OutOfPages
from edgemoe.cache.prefix_cache import NoPrefixCache, PrefixCache, PrefixMatch, make_prefix_cache

__all__ = ["KVPool", "NoPrefixCache", "OutOfPages", "PrefixCache", "PrefixMatch", "make_prefix_cache"]
