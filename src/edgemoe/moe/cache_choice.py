"""Where the slot cache's bookkeeping runs (`--expert-cache`): the choice and what it
refuses. Torch-free, so the engine config checks settings with the same rules the
executor registry applies (moe/registry.py)."""

from __future__ import annotations

EXPERT_CACHES = ("host", "device")  # what `--expert-cache auto` resolves to


def resolve_expert_cache(setting: str, device_type: str, backend: str, policy: str) -> str:
    """`--expert-cache auto`: device on a GPU when the backend is offload or auto and the
    policy LRU, else host. Measured at 16 GiB on the GPU machine (docs/benchmarks.md):
    decode steps in CUDA graphs with no host read per layer ran 184 tok/s where the host
    cache's per-layer reads held auto to 8.7; under heavy misses (synthetic routing, 113
    misses a token) 15.4 against 13.2. What it gives up is auto's CPU split: `--expert-cache
    host` (or --moe-backend hybrid) keeps it."""
    if setting != "auto":
        return setting
    on_device = device_type == "cuda" and backend in ("offload", "auto") and policy == "lru"
    return "device" if on_device else "host"


def check_device_cache(backend: str, policy: str) -> None:
    """Refuse what `--expert-cache device` can't run."""
    if backend in ("cpu", "hybrid"):
        raise ValueError(f"expert_cache (--expert-cache) device runs the offload backend (or resident), not "
                         f"{backend!r}: cpu/hybrid read each layer's routing on the host (use --expert-cache host)")
    if policy != "lru":
        raise ValueError(f"expert_cache (--expert-cache) device evicts by LRU only (got --moe-policy {policy})")
