"""Pinned staging rows for PLE fills, and the CUDA events that say when the device has
read them. Both live on the engine thread only: the filler thread writes into rows it
was given and never touches an allocator or an event (no driver call there can block
behind a graph launch).
"""

from __future__ import annotations

import bisect

import torch


class RangeAllocator:
    """First-fit ranges of token rows in [0, capacity); adjacent free ranges merge."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity else []  # (start, end), sorted

    @property
    def free_rows(self) -> int:
        return sum(e - s for s, e in self._free)

    def alloc(self, n: int) -> int | None:
        """The start of n free contiguous rows, or None."""
        for i, (s, e) in enumerate(self._free):
            if e - s >= n:
                self._free[i : i + 1] = [(s + n, e)] if e - s > n else []
                return s
        return None

    def free(self, start: int, n: int) -> None:
        if n == 0:
            return
        i = bisect.bisect_left(self._free, (start, start + n))
        prev_end = self._free[i - 1][1] if i else -1
        nxt = self._free[i][0] if i < len(self._free) else self.capacity + 1
        if prev_end > start or nxt < start + n or start + n > self.capacity:
            raise ValueError(f"free of rows [{start}, {start + n}) that are not allocated")
        s, e = start, start + n
        if i < len(self._free) and self._free[i][0] == e:
            e = self._free.pop(i)[1]
        if i and self._free[i - 1][1] == s:
            s = self._free.pop(i - 1)[0]
            i -= 1
        self._free.insert(i, (s, e))


class EventPool:
    """CUDA events recorded after a copy out of staging rows, recycled (engine thread only)."""

    def __init__(self) -> None:
        self._free: list[torch.cuda.Event] = []

    def record(self) -> torch.cuda.Event:
        event = self._free.pop() if self._free else torch.cuda.Event()
        event.record()
        return event

    def recycle(self, event: torch.cuda.Event) -> None:
        self._free.append(event)
