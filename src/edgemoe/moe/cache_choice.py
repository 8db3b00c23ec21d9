"""Where the slot cache's bookkeeping runs (`--expert-cache`): the choice and what it
refuses. Torch-free, so the engine config checks settings with the same rules the
executor registry applies (moe/registry.py)."""

from __future__ import annotations

EXPERT_CACHES = ("host", "device")  # what `--expert-cache auto` resolves to
DEVICE_POLICIES = ("lru", "lru-plain")  # the --moe-policy values the device cache restates


def resolve_expert_cache(setting: str, device_type: str, backend: str, policy: str,
                         cpu_experts_per_layer: int | None = None) -> str:
    """`--expert-cache auto`: device on a GPU when the backend is offload or auto and the
    policy one of the LRUs, else host. Measured at 16 GiB on the GPU machine (docs/benchmarks.md):
    decode steps in CUDA graphs with no host read per layer ran 184 tok/s where the host
    cache's per-layer reads held auto to 8.7; under heavy misses (synthetic routing, 113
    misses a token) 15.4 against 13.2. What it gives up is auto's CPU split: `--expert-cache
    host` (or --moe-backend hybrid) keeps it. hybrid with `--cpu-experts-per-layer` (a fixed
    CPU quota, planned on the device cache alone) resolves to device on any device."""
    if setting != "auto":
        return setting
    if backend == "hybrid" and cpu_experts_per_layer is not None:
        return "device"
    on_device = device_type == "cuda" and backend in ("offload", "auto") and policy in DEVICE_POLICIES
    return "device" if on_device else "host"


def check_device_cache(backend: str, policy: str, cpu_experts_per_layer: int | None = None) -> None:
    """Refuse what `--expert-cache device` can't run."""
    if backend == "hybrid" and cpu_experts_per_layer is None:
        raise ValueError("expert_cache (--expert-cache) device with --moe-backend hybrid needs a fixed CPU quota, "
                         "--cpu-experts-per-layer N (the live controller reads each layer's routing on the host: "
                         "use --expert-cache host for it)")
    if backend == "cpu":
        raise ValueError("expert_cache (--expert-cache) device runs offload, hybrid with --cpu-experts-per-layer, or "
                         "resident, not 'cpu': it reads each layer's routing on the host (use --expert-cache host)")
    if policy not in DEVICE_POLICIES:
        raise ValueError(f"expert_cache (--expert-cache) device evicts by {' or '.join(DEVICE_POLICIES)} only "
                         f"(got --moe-policy {policy})")


def check_cpu_quota(backend: str, expert_cache: str, cpu_experts_per_layer: int | None) -> None:
    """`--cpu-experts-per-layer` belongs to hybrid on the device cache alone (never ignored)."""
    if cpu_experts_per_layer is None:
        return
    if cpu_experts_per_layer < 0:
        raise ValueError(f"cpu_experts_per_layer (--cpu-experts-per-layer) must be >= 0 (got {cpu_experts_per_layer})")
    if backend != "hybrid" or expert_cache == "host":
        raise ValueError("cpu_experts_per_layer (--cpu-experts-per-layer) sets the CPU's quota of --moe-backend hybrid "
                         f"with --expert-cache device (got --moe-backend {backend}, --expert-cache {expert_cache})")
