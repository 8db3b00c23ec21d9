"""A step's token masks onto the device without holding the host (`Constraints.step_masks`).

NOTE: a copy from pageable memory larger than the driver's staging buffer returns only
once the stream has reached it: with overlap scheduling, after the step in flight. On an
H100 (2026-12-06, `scripts/structured_step_cost.py`) a batch of 8 with one row in a think
block (its [8, 151,936] mask uploaded whole every step, 1.2 MB) decoded at 0.84 of plain
where a batch of 1 (152 KB) did at 0.97. So the masks start as ones on the device, only
the masked rows travel, from two page-locked buffers used in turn (each reused once its
previous copies have run: an event), and a mask that stays the same step after step (the
one after a think block's close) travels once.
"""

from __future__ import annotations

import numpy as np
import torch


class MaskUpload:
    def __init__(self, width: int) -> None:
        self.width = width
        self._buffers: list[torch.Tensor | None] = [None, None]  # page-locked [rows, width] bool
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._kept: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # id(array) → (array, its device copy)

    def rows(self, masks: list[np.ndarray | None], device: torch.device) -> torch.Tensor:
        """bool [len(masks), width] on `device`: each given row's mask, True where None."""
        if device.type != "cuda":
            out = np.ones((len(masks), self.width), dtype=bool)
            for i, m in enumerate(masks):
                if m is not None:
                    out[i] = m
            return torch.from_numpy(out).to(device)
        allowed = torch.ones((len(masks), self.width), dtype=torch.bool, device=device)
        given = [(i, m) for i, m in enumerate(masks) if m is not None]
        if given:
            staging = self._staging(len(given))
            for j, (i, m) in enumerate(given):
                np.copyto(staging[j].numpy(), m)
                allowed[i].copy_(staging[j], non_blocking=True)
            self._record(device)
        return allowed

    def kept(self, array: np.ndarray, device: torch.device) -> torch.Tensor:
        """`array` on `device`, uploaded the first time this array object is asked for
        (NOTE: the caller never changes it afterwards, as `pending_mask`'s contract says)."""
        hit = self._kept.get(id(array))
        if hit is not None and hit[0] is array:
            return hit[1]
        if len(self._kept) > 64:  # think blocks long over: drop their copies
            self._kept.clear()
        copy = torch.from_numpy(array).to(device, non_blocking=True)  # 152 KB: within the staging buffer
        self._kept[id(array)] = (array, copy)
        return copy

    def _staging(self, rows: int) -> torch.Tensor:
        """This turn's page-locked buffer of at least `rows` rows, free to overwrite."""
        self._turn ^= 1
        event, buf = self._events[self._turn], self._buffers[self._turn]
        if event is not None:
            event.synchronize()  # its copies of two steps ago: long done
        if buf is None or buf.shape[0] < rows:
            size = 1 << (rows - 1).bit_length()
            buf = self._buffers[self._turn] = torch.empty((size, self.width), dtype=torch.bool, pin_memory=True)
        return buf

    def _record(self, device: torch.device) -> None:
        event = self._events[self._turn]
        if event is None:
            event = self._events[self._turn] = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
