"""What the CPU share's device side agrees on (`kernels/share_split.py`, its torch
reference and dispatch, and `triton_ops/share_split.py`): one layer's persistent state and
the pick's constants.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

HEAT_SHIFT = 3  # heat loses 1/8 a decode step: a routing's weight halves in ~5 steps
NOT_MISSED = torch.iinfo(torch.int64).max  # the selection key of experts the CPU can't take


class ShareState(NamedTuple):
    """One layer's view: `resident` [E] int32 (the slot map row, -1: not resident),
    `heat` [E] int64 (updated in place), `quota`, `fraction` and `heat_unit` 0-d int64
    (the decode pick takes at most `quota` misses and `fraction` sixteenths of the layer's
    misses, rounded half up: `FRACTION_ONE` leaves the quota alone), `cpu_count`
    0-d int64 (CPU experts, cumulative), `cpu_col` [≥ T·K] int32 (each pair's mailbox
    column, -1 for the device's: written here, read by the combine, which takes the CPU's
    cells from the mailbox by it — `kernels/cell_sources.py`), `scratch` [E] int32 (the
    fused kernel's), `rates` [4] int64 ns (a CPU expert's fixed cost, each of its tokens; a
    device expert's copy, and its share of the chunk's grouped GEMMs: the prompt rule's
    balance). `prefetched` [E] bool or None: the experts the decode prefetch copied into this
    layer's slots for this step, counted with the misses by the decode pick's count (they were
    misses when the prefetch left the pick's share of them to the CPU, `drop_cpu_picks`: the
    pick takes as many as were left, not its fraction of what the prefetch left)."""

    resident: torch.Tensor
    heat: torch.Tensor
    quota: torch.Tensor
    fraction: torch.Tensor
    heat_unit: torch.Tensor
    cpu_count: torch.Tensor
    cpu_col: torch.Tensor
    scratch: torch.Tensor
    rates: torch.Tensor
    prefetched: torch.Tensor | None = None


DECODE, PROMPT = 0, 1  # the pick: the quota's coldest misses (decode steps), or the balance (prompt chunks)
FRACTION_SHIFT = 4
FRACTION_ONE = 1 << FRACTION_SHIFT  # `fraction` in sixteenths of a layer's misses: 16, all of them
