"""KV cache: the paged pool (and, later, the prefix tree and state snapshots)."""

from edgemoe.cache.kv_pool import KVPool, OutOfPages

__all__ = ["KVPool", "OutOfPages"]
