"""What torch's CUDA caching allocator did during a bench phase.

A prefill that runs a third slower after other runs in the same process (docs/benchmarks.md,
third GPU run) points at the allocator: under the engine's memory cap (`--gpu-memory` →
the per-process memory fraction) a request the cache can't serve makes it free every
cached block and retry — a device synchronisation and `cudaFree`s mid-step. These
counters say whether that happened: `num_alloc_retries` (frees forced by a failed
allocation), `num_device_alloc` / `num_device_free` (`cudaMalloc` / `cudaFree` calls),
and the reserved peak. Read through `torch.cuda.memory_stats` (no sync); empty on a CPU.
"""

from __future__ import annotations

from typing import Any

import torch

COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free")
RESERVED_PEAK = "reserved_bytes.all.peak"


def allocator_snapshot(device: torch.device) -> dict[str, int]:
    """The cumulative counters now ({} off CUDA); the reserved peak is reset, so the next
    snapshot's peak is this phase's."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    torch.cuda.reset_peak_memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in COUNTERS}


def allocator_traffic(device: torch.device, before: dict[str, int]) -> dict[str, Any]:
    """The counters' change since `before` and the phase's reserved peak in GiB."""
    if device.type != "cuda" or not before:
        return {}
    stats = torch.cuda.memory_stats(device)
    out: dict[str, Any] = {k: int(stats.get(k, 0)) - before[k] for k in COUNTERS}
    out["reserved_peak_gib"] = stats.get(RESERVED_PEAK, 0) / 2**30
    return out
