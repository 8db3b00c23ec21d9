"""The device page table: one row of KV page ids per running request.

`table` is [max_running + 1, max_pages] int32 on the compute device. A request owns a
row from admission until it finishes or is preempted; the scheduler writes page ids
into it when it allocates them (never a per-step rebuild of a sequence's context).
The last row is a scratch row no request ever owns: padded batch entries (CUDA graphs)
point at it, so a padded entry reads valid memory and writes nothing anyone reads.

Writes are staged on the host and flushed to the device once per step (`flush`), in
one copy, before the step's kernels run; kernels index the table by `req_rows`.
"""

from __future__ import annotations

import numpy as np
import torch


class PageTable:
    """Rows of page ids on the device plus their host mirror.

    Contract: `assign()` hands out a free row; `write(row, start, pages)` sets entries
    [start, start + len(pages)) of that row; `release(row)` returns it. The device
    table reflects every write once `flush()` has been called, in stream order, so a
    step must flush after its scheduling and before its forward. Entries past a
    request's pages are stale and never read (kernels stop at `seq_lens`).
    Not thread-safe: the engine loop owns it.
    """

    def __init__(self, max_rows: int, max_pages: int, device: torch.device, scratch_page: int = 0) -> None:
        if max_rows < 1 or max_pages < 1:
            raise ValueError(f"need positive sizes, got {max_rows=} {max_pages=}")
        self.max_rows, self.max_pages, self.device = max_rows, max_pages, device
        self.scratch_row = max_rows  # NOTE: never assigned; padded entries point here
        self.table = torch.zeros((max_rows + 1, max_pages), dtype=torch.int32, device=device)
        self.host = np.zeros((max_rows + 1, max_pages), dtype=np.int32)
        self.table[self.scratch_row] = scratch_page  # the KV pool's page nobody owns
        self.host[self.scratch_row] = scratch_page
        self.scratch_page = scratch_page
        self._free = list(range(max_rows - 1, -1, -1))  # pop() hands out low rows first
        self._dirty: dict[int, tuple[int, int]] = {}  # row -> [lo, hi) columns written

    @property
    def num_free(self) -> int:
        return len(self._free)

    def assign(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.max_rows} page-table rows are in use")
        return self._free.pop()

    def release(self, row: int) -> None:
        if not 0 <= row < self.max_rows or row in self._free:
            raise ValueError(f"page-table row {row} is not assigned")
        self._free.append(row)
        self._dirty.pop(row, None)

    def write(self, row: int, start: int, pages: list[int]) -> None:
        """Entries [start, start + len(pages)) of `row` := pages (staged until flush)."""
        if not pages:
            return
        end = start + len(pages)
        if end > self.max_pages:
            raise ValueError(f"{end} pages exceed the table's {self.max_pages} per request")
        self.host[row, start:end] = pages
        lo, hi = self._dirty.get(row, (start, end))
        self._dirty[row] = (min(lo, start), max(hi, end))

    def flush(self) -> None:
        """Copy the rows written since the last flush to the device (one copy per row
        segment; a step usually has a few: new admissions and page-boundary crossings)."""
        if not self._dirty:
            return
        if self.device.type == "cpu":
            for row, (lo, hi) in self._dirty.items():
                self.table[row, lo:hi] = torch.from_numpy(self.host[row, lo:hi])
        else:
            for row, (lo, hi) in self._dirty.items():
                # NOTE: from pageable memory the copy is staged by the driver before
                # returning, so the host row may change afterwards without a race.
                self.table[row, lo:hi].copy_(torch.from_numpy(self.host[row, lo:hi]), non_blocking=True)
        self._dirty.clear()

    def pages(self, row: int, count: int) -> np.ndarray:
        """The first `count` page ids of `row` (host mirror)."""
        return self.host[row, :count]
