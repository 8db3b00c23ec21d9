"""Sliding windows over recent traffic: rates (tokens/s) and latency percentiles (TTFT).

Prometheus histograms answer "since the server started"; `/v1/stats` answers "right
now", so it reads these windows instead. Both are bounded in memory whatever the load.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


class RateWindow:
    """Amounts added over the last `span_s` seconds, in one-second bins."""

    def __init__(self, span_s: int = 60) -> None:
        self.span_s = span_s
        self._bins: deque[list[float]] = deque()  # [second, amount], oldest first
        self._start: float | None = None

    def add(self, amount: float, now: float) -> None:
        if self._start is None:
            self._start = now
        second = math.floor(now)
        if self._bins and self._bins[-1][0] == second:
            self._bins[-1][1] += amount
        else:
            self._bins.append([second, amount])
        self._trim(now)

    def total(self, now: float) -> float:
        self._trim(now)
        return sum(amount for _, amount in self._bins)

    def rate(self, now: float) -> float:
        """Per second, over the window (or over the time since the first add, if shorter)."""
        if self._start is None:
            return 0.0
        seconds = min(float(self.span_s), max(now - self._start, 1.0))
        return self.total(now) / seconds

    def _trim(self, now: float) -> None:
        oldest = math.floor(now) - self.span_s
        while self._bins and self._bins[0][0] <= oldest:
            self._bins.popleft()


@dataclass(frozen=True)
class Percentiles:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class SampleWindow:
    """The last `max_samples` values seen within `span_s` seconds."""

    def __init__(self, span_s: float = 300.0, max_samples: int = 2048) -> None:
        self.span_s = span_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, value: float, now: float) -> None:
        self._samples.append((now, value))

    def summary(self, now: float) -> Percentiles:
        while self._samples and self._samples[0][0] < now - self.span_s:
            self._samples.popleft()
        values = sorted(v for _, v in self._samples)
        mean = sum(values) / len(values) if values else None
        return Percentiles(len(values), mean, percentile(values, 50), percentile(values, 90), percentile(values, 99))
