"""Where the slot cache's bookkeeping runs (`--expert-cache`): the choice and what it
refuses. Torch-free, so the engine config checks settings with the same rules the
executor registry applies (moe/registry.py)."""

from __future__ import annotations

EXPERT_CACHES = ("host", "device")  # what `--expert-cache auto` resolves to
DEVICE_POLICIES = ("lru", "lru-plain")  # the --moe-policy values the device cache restates


def resolve_expert_cache(setting: str, device_type: str, backend: str, policy: str,
                         cpu_experts_per_layer: int | None = None) -> str:
    """`--expert-cache auto`: device on a GPU when the backend is offload, hybrid or auto and
    the policy one of the LRUs, else host. Measured at 16 GiB on the GPU machine
    (docs/benchmarks.md): decode steps in CUDA graphs with no host read per layer ran 184
    tok/s where the host cache's per-layer reads held auto to 8.7; under heavy misses
    (synthetic routing, 113 misses a token) 15.4 against 13.2. hybrid and auto keep a CPU
    share there (`moe/cpu_share.py`, its quota live: `moe/quota_controller.py`, or fixed:
    `--cpu-experts-per-layer`, which resolves to device on any device, or
    `--moe-hybrid-fraction`: a fixed share of each layer's misses, as the host cache's
    controller's fixed split was; until 2026-12-04 the fraction resolved to host)."""
    if setting != "auto":
        return setting
    if backend == "hybrid" and cpu_experts_per_layer is not None:
        return "device"
    on_device = device_type == "cuda" and backend in ("offload", "hybrid", "auto") and policy in DEVICE_POLICIES
    return "device" if on_device else "host"


def check_device_cache(backend: str, policy: str) -> None:
    """Refuse what `--expert-cache device` can't run."""
    if backend == "cpu":
        raise ValueError("expert_cache (--expert-cache) device runs offload, hybrid, auto or resident, not 'cpu': "
                         "it reads each layer's routing on the host (use --expert-cache host)")
    if policy not in DEVICE_POLICIES:
        raise ValueError(f"expert_cache (--expert-cache) device evicts by {' or '.join(DEVICE_POLICIES)} only "
                         f"(got --moe-policy {policy})")


def check_backend_settings(backend: str, moe_slots: int | None, hybrid_fraction: float | None) -> None:
    """`--moe-slots` sizes a slot cache, which resident experts have none of; `--moe-hybrid-fraction`
    is hybrid's split (the executors read neither elsewhere: refused, never ignored)."""
    if moe_slots is not None and backend == "resident":
        raise ValueError("moe_slots (--moe-slots) sizes the expert slot cache of --moe-backend offload, cpu, hybrid or "
                         "auto; --moe-backend resident holds every expert on the device and has no slots")
    if hybrid_fraction is not None and backend != "hybrid":
        raise ValueError("moe_hybrid_fraction (--moe-hybrid-fraction) fixes the CPU's share of --moe-backend hybrid "
                         f"(got --moe-backend {backend})")


def check_cpu_quota(backend: str, expert_cache: str, cpu_experts_per_layer: int | None) -> None:
    """`--cpu-experts-per-layer` belongs to hybrid on the device cache alone (never ignored)."""
    if cpu_experts_per_layer is None:
        return
    if cpu_experts_per_layer < 0:
        raise ValueError(f"cpu_experts_per_layer (--cpu-experts-per-layer) must be >= 0 (got {cpu_experts_per_layer})")
    if backend != "hybrid" or expert_cache == "host":
        raise ValueError("cpu_experts_per_layer (--cpu-experts-per-layer) sets the CPU's quota of --moe-backend hybrid "
                         f"with --expert-cache device (got --moe-backend {backend}, --expert-cache {expert_cache})")


def check_prompt_cpu(backend: str, expert_cache: str, prompt_cpu: bool | None) -> None:
    """`--prompt-cpu` is the device cache's CPU share's: hybrid or auto, not the host cache
    (asked for; unset, it is on only where that share runs)."""
    if not prompt_cpu:
        return
    if backend not in ("hybrid", "auto") or expert_cache == "host":
        raise ValueError("prompt_cpu (--prompt-cpu) gives prompt chunks' sparse experts to the device cache's CPU "
                         f"share: --moe-backend hybrid or auto, --expert-cache auto or device (got --moe-backend "
                         f"{backend}, --expert-cache {expert_cache})")


def check_prefetch(backend: str, expert_cache: str, mover: str, prefetch: str) -> None:
    """`--moe-prefetch on` is the device cache's (never ignored); its mover must run beside
    the chain (the executor says so where `copy` can't: no GPU or no C compiler). `auto`
    is never refused: off, logged, where nothing can prefetch."""
    if prefetch != "on":
        return
    if backend in ("resident", "cpu") or expert_cache == "host":
        raise ValueError("moe_prefetch (--moe-prefetch on) prefetches into the device expert cache: "
                         "--moe-backend offload, hybrid or auto, --expert-cache auto or device "
                         f"(got --moe-backend {backend}, --expert-cache {expert_cache}, --expert-mover {mover})")
