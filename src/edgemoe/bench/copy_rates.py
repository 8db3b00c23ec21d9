"""`edgemoe bench bw`'s host→device rates: the copy engine's (pinned and pageable, one
expert and 256 MiB), a device-to-device copy, and the device cache's gather mover — the
SMs reading the page-locked pool mapped into the device, one expert a call, at the decode
step's grid and at decode prefetch's side grid. Hosts differ in the last: on 2026-12-07
one H100 host gathered at 33 GB/s at every grid where its copy engine moved 48.8, the
next gathered at 48 against 47.7 (docs/benchmarks.md, "fp8 offload's side grid measured").
CUDA only; the caller checks.
"""

from __future__ import annotations

import torch

from edgemoe.bench.cuda_timing import eager_us
from edgemoe.kernels.backend import triton_importable
from edgemoe.kernels.gather_grid import GatherGrid
from edgemoe.kernels.row_gather import gather_parts_into
from edgemoe.moe.pinning import uva_view


def _cuda_rate(dst: torch.Tensor, sources: list[torch.Tensor], reps: int) -> float:
    """GB/s of `reps` async copies into `dst`, rotating through `sources`."""
    us = eager_us(lambda i: dst.copy_(sources[i % len(sources)], non_blocking=True), reps)
    return dst.numel() * dst.element_size() / us / 1e3


def copy_rates(pool_bytes: int, one_expert: int) -> dict[str, float]:
    """Host→device (pinned, pageable; one expert, 256 MiB) and device→device GB/s; a size
    larger than the pool (`--pool-mib`) is left out."""
    pageable = torch.empty(pool_bytes, dtype=torch.uint8).fill_(1)
    pinned = torch.empty(pool_bytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    rates = {}
    for size, label in ((one_expert, "expert"), (256 * 2**20, "256MiB")):
        if size > pool_bytes:
            continue
        dst = torch.empty(size, dtype=torch.uint8, device="cuda")
        for kind, host in (("pinned", pinned), ("pageable", pageable)):
            chunks = [host[i : i + size] for i in range(0, host.numel() - size + 1, size)]  # rotate: no cache reuse
            rates[f"h2d_{kind}_{label}_gb_s"] = _cuda_rate(dst, chunks, max(8, 4 * len(chunks)) if label == "expert" else 8)
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    rates["d2d_1GiB_gb_s"] = _cuda_rate(torch.empty_like(a), [a], 10)  # bytes copied (each read once, written once)
    if triton_importable() and one_expert <= pool_bytes:
        rates |= gather_rates(pinned, one_expert)
    return rates


def gather_rates(pinned: torch.Tensor, one_expert: int) -> dict[str, float]:
    """GB/s of the device cache's gather mover (`kernels/row_gather.gather_parts_into`) from
    the page-locked pool `pinned`, mapped into the device: one expert a call, rotating
    through the pool, at the decode step's grid and at the prefetch side stream's."""
    from edgemoe.moe.prefetch import prefetch_grid

    device = torch.device("cuda", torch.cuda.current_device())
    rows = pinned.numel() // one_expert
    table = uva_view(pinned[: rows * one_expert].view(rows, one_expert), device)
    out = torch.empty(2, one_expert, dtype=torch.uint8, device=device)
    reps = max(8, 2 * rows)
    lists = torch.full((reps + 1, 2, 16), -1, dtype=torch.int32)  # a miss list a call, -1 padded as the cache writes it
    lists[:, 0, 0], lists[:, 1, 0] = torch.arange(reps + 1) % rows, torch.arange(reps + 1) % 2
    lists = lists.to(device)
    rates = {}
    for label, grid in (("gather", GatherGrid()), ("gather_side", prefetch_grid())):
        def call(i: int, grid: GatherGrid = grid) -> None:
            gather_parts_into([table], lists[i, 0], [out], lists[i, 1], grid)
        rates[f"h2d_{label}_expert_gb_s"] = one_expert / eager_us(call, reps) / 1e3
    return rates
