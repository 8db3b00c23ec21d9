"""The device slot cache's victim sort keys, shared by the torch plan
(`moe/device_cache.py`) and the fused plan's kernel (`triton_ops/slot_plan.py`).
"""

# A slot that may not be evicted sorts last; a fresh slot ("lru", scan-resistant) sorts as
# FRESH - recency, above every stale key (a recency), in descending recency. NOTE: exact
# while recency < 2**61 (uses counted since start-up).
NEVER = 2**63 - 1
FRESH = 2**62
