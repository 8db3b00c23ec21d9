"""Per-(MoE layer, expert) activity for the live view: what each expert did since the last look.

Off unless someone watches (`MoEStats.watch`): the executors check one attribute per
layer and do nothing else, so an unwatched engine pays nothing. Watched, they mark the
experts a layer served from a slot (hit), copied in (miss) or computed on the host CPU,
from the lists they already hold on the host; the resident executor's hits come from its
device counters when `MoEStats.resolve` reads them. `expert_map` turns the marks and the
slot map into one character per (layer, expert) and starts the next interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Events, in priority order: a cell shows the strongest one since the last map.
HIT, MISS, CPU = 1, 2, 3

# Cell codes: "0" not on the device and idle, "1" resident and idle, then the events.
CODES = np.frombuffer(b"01234", dtype=np.uint8)


class ExpertActivity:
    """The strongest event of each (layer, expert) since the last `take` (host numpy, tiny)."""

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.events = np.zeros((num_layers, num_experts), dtype=np.uint8)  # [L, E]

    def mark(self, layer: int, experts: Sequence[int], event: int) -> None:
        if len(experts):
            row, idx = self.events[layer], np.asarray(experts, dtype=np.int64)
            row[idx] = np.maximum(row[idx], event)

    def mark_counts(self, counts: np.ndarray, event: int) -> None:
        """Every (layer, expert) with a non-zero count in `counts` [L, E] had `event`."""
        np.maximum(self.events, np.where(counts > 0, event, 0).astype(np.uint8), out=self.events)

    def take(self, layers: Sequence[int], resident: np.ndarray | None) -> list[str]:
        """One string per MoE layer in `layers`, one code per expert; clears the events.

        `resident` [L, E] bool: experts in a device slot now (None: all of them)."""
        rows = self.events[list(layers)]
        base = np.ones_like(rows) if resident is None else resident[list(layers)].astype(np.uint8)
        codes = CODES[np.where(rows > 0, rows + 1, base)]
        self.events.fill(0)
        return [bytes(row).decode("ascii") for row in codes]
