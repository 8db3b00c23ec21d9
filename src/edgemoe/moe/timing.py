"""Timing a stretch of device work without waiting for it: CUDA events read lazily.

`DeviceTimer.start()` records a start event on the current stream; `stop()` an end event,
returning an `Interval` whose `query()` gives the seconds between them once the device
has passed the end (`cudaEventQuery`: never a synchronisation), else None. On the CPU the
work is synchronous, so the interval is wall-clock time and known at once.
"""

from __future__ import annotations

import time

import torch


class Interval:
    def __init__(self, start: torch.cuda.Event | None, end: torch.cuda.Event | None, seconds: float | None) -> None:
        self._start, self._end, self._seconds = start, end, seconds

    def query(self) -> float | None:
        if self._seconds is None and self._end is not None and self._end.query():
            self._seconds = self._start.elapsed_time(self._end) / 1000  # type: ignore[union-attr]
            self._start = self._end = None
        return self._seconds


class DeviceTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._start: torch.cuda.Event | None = None
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> Interval:
        if not self.cuda:
            return Interval(None, None, time.perf_counter() - self._t0)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return Interval(self._start, end, None)
