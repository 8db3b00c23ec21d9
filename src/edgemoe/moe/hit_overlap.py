"""A decode wave's hits computed while its misses travel (the device expert cache with the
gather mover; `EDGEMOE_OVERLAP_HITS`, docs/offload.md).

Without it a wave is plan → gather → compute: the expert GEMVs wait for the slowest of the
layer's copies, and the hits' GEMVs (most of a layer's pairs at a warm cache) run after the
link is idle again. Here the gather runs on a side stream forked after the plan, the hits'
pairs compute on the decode stream beside it, and only the misses' pairs compute after the
join. The two passes are masks over one routing written into per-pair cells (a pair whose
slot is -1 leaves its cell untouched), so results are bitwise the one-pass wave's.

Safe to overlap: the gather writes only the slots the plan gave the misses (free or evicted
ones; a hit's slot is protected by the plan), and the hits' GEMVs read only hits' slots.
The side gather runs on a grid of its own (`SIDE_PROGRAMS`): the decode step's full grid
keeps ~4 MB of host reads in flight and starves the kernels beside it (docs/benchmarks.md,
the first pipelined prefetch: `_gate_up_gemv` 316 µs a call against 15 alone).

Costs on the decode stream: the hit / miss masks (a few small launches, beside the gather)
and a second launch of each GEMV (after the join, for the misses' pairs only).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from edgemoe.kernels.gather_grid import GatherGrid
from edgemoe.moe.device_cache import WavePlan

SIDE_PROGRAMS = 132  # the side gather's programs by default: one a multiprocessor of an H100


def overlap_grid() -> GatherGrid | None:
    """The side gather's grid when `EDGEMOE_OVERLAP_HITS` asks for the overlap ("1": the
    default grid; a number above 1: that many programs), else None (off, the default)."""
    value = os.environ.get("EDGEMOE_OVERLAP_HITS", "0").strip() or "0"
    if not value.isdigit():
        raise ValueError(f"EDGEMOE_OVERLAP_HITS={value!r}: 0 (off), 1 (on) or the side gather's programs")
    programs = int(value)
    if programs == 0:
        return None
    return GatherGrid(SIDE_PROGRAMS if programs == 1 else programs)


class HitOverlap:
    """Runs a wave's move and its two compute passes, the move on `side` (None: in order on
    the current stream, as on a CPU: the same passes, for tests)."""

    def __init__(self, device: torch.device, grid: GatherGrid) -> None:
        self.grid = grid
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.device = device

    def run(self, plan: WavePlan, ids: torch.Tensor, move: Callable[[GatherGrid], None],
            compute: Callable[[torch.Tensor], None]) -> None:
        """`move(grid)` fills the wave's missed slots; `compute(slot_ids)` fills the cells of
        the pairs whose slot is not -1; `ids`: the wave's routing [T, K]."""
        if self.side is None:
            move(self.grid)
            hit_pairs = plan.hit_pairs(ids)
            compute(plan.slot_ids.masked_fill(~hit_pairs, -1))
            compute(plan.slot_ids.masked_fill(hit_pairs, -1))
            return
        main = torch.cuda.current_stream(self.device)
        self.side.wait_stream(main)  # the plan's miss list and slot map are written
        with torch.cuda.stream(self.side):
            move(self.grid)
        hit_pairs = plan.hit_pairs(ids)  # the masks run beside the gather
        miss_ids = plan.slot_ids.masked_fill(hit_pairs, -1)
        compute(plan.slot_ids.masked_fill(~hit_pairs, -1))
        main.wait_stream(self.side)  # the misses' slots are filled
        compute(miss_ids)
