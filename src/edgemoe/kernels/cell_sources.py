"""Cells a MoE combine reads from elsewhere than the step's cell buffer.

The device expert cache's layer leaves two kinds of pairs unwritten in its [T, K, H]
cells: a padding row's (routed nothing: its cell is 0) and the CPU share's (computed on
the CPU: the cell is a row of the share's mailbox, pinned host memory the device reads
through its mapping). Writing them into the buffer took two launches a decode layer on
the chain between the CPU's answer and the next layer's attention (a `masked_fill` and
the share's finish copy, ~7 µs with their gaps on an H200); the combine reads them where
they are instead (`triton_ops/moe_combine.py`), the same values: the k-sum is bitwise
what the buffer written first would give.

The CPU's cells are read only once the CPU is done: `ready` names the bell's turn the
combine awaits from inside its launch (`kernels/cpu_bell.py`); without it the stream
already waited.

`apply_sources` is the reference and the torch path: it writes them into the buffer
(after awaiting `ready` on the stream).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from edgemoe.kernels.cpu_bell import BellTurn, await_turn


class CellSources(NamedTuple):
    """`dead` [T] bool (or None): a padding row, whose pairs route nothing: its cells
    are 0; `cpu_col` [≥ T·K] int32 (or None): pair p = t·K + k whose `cpu_col[p]` ≥ 0 has
    its cell in row `cpu_col[p]` of `cpu_out` [cap, H] fp32 (the CPU share's mailbox);
    `ready` (or None): the bell's turn to await before reading `cpu_out`."""

    dead: torch.Tensor | None = None
    cpu_col: torch.Tensor | None = None
    cpu_out: torch.Tensor | None = None
    ready: BellTurn | None = None


def apply_sources(cells: torch.Tensor, sources: CellSources | None) -> torch.Tensor:
    """`cells` [T, K, H] with the sources' cells written in (in place; no host read)."""
    if sources is None:
        return cells
    T, K, H = cells.shape
    flat = cells.view(T * K, H)
    if sources.ready is not None:
        await_turn(sources.ready)
    if sources.cpu_col is not None:
        assert sources.cpu_out is not None
        col = sources.cpu_col[: T * K].long()
        cpu = sources.cpu_out.index_select(0, col.clamp(min=0).to(sources.cpu_out.device)).to(cells.device)
        flat.copy_(torch.where((col >= 0)[:, None], cpu, flat))
    if sources.dead is not None:
        cells.masked_fill_(sources.dead[:, None, None], 0.0)
    return cells
