"""The decode step period both step-timing controllers read (the live quota's,
`moe/quota_controller.py`, and decode prefetch's, `moe/prefetch_choice.py`): the time
between the starts of two consecutive decode steps of the same batch size. Inside a
captured step nothing runs on the host, so the host sees only whole steps; with the
overlap scheduler this period is the device's step time once the queue is full."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepPeriods:
    _last: tuple[float, int] | None = None  # (start time, batch size) of the last decode step

    def period(self, now: float, batch: int | None) -> float | None:
        """A step starts at `now`; `batch`: its decode batch size, or None for a step no
        period is taken from (a prompt chunk). The period it closes, or None where there is
        none to attribute (after such a step, or at a new batch size)."""
        last, self._last = self._last, (now, batch) if batch is not None else None
        if batch is None or last is None or last[1] != batch:
            return None
        return now - last[0]

    def forget(self) -> None:
        """No period spans the steps until the next `period`."""
        self._last = None
