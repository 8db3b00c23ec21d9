"""The scatter form's launch grid (`kernels/row_gather.py`'s `gather_parts_into`, its
Triton kernel in `triton_ops/row_gather.py`): what the dispatcher, the kernel and the
movers that size it (`moe/movers.py`, `moe/prefetch.py`) agree on.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_INTO = 2048  # columns a work item of the scatter form copies (its rows are whole experts: wide)


@dataclass(frozen=True)
class GatherGrid:
    """The scatter form's launch: `programs` (None: a few a multiprocessor), the columns a
    work item copies (`block`, a power of two) and the warps a program runs. A gather
    beside other kernels takes fewer programs (`moe/prefetch.py`); each program's bytes in
    flight are block x the row's element size."""

    programs: int | None = None
    block: int = BLOCK_INTO
    warps: int = 4
