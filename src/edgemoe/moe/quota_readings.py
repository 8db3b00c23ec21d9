"""The live quota's measurements (`moe/quota_controller.py`): each window's median period
by level, and the margin a level must win by — scaled with the steps' measured noise, so
that a comparison is only believed where the difference stands clear of it.

A window of 8 periods at a few % of per-step noise (the GPU machine's host, 2026-12-05)
has a median uncertain by ~1.3%; two such windows differ by ~1.9% of pure noise, so the
fixed 2% margin of before was one standard error: noise alone moved the search. The noise
is estimated robustly from every window's own spread (the median absolute deviation, so a
stalled step doesn't count) and the margin between two figures is `Z` standard errors of
their difference, never below the configured floor (a noiseless step still needs a real
gain to move)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

Z = 2.0  # standard errors a difference must exceed to count
MEDIAN_SE = 1.2533  # a median of n normal draws has the standard error MEDIAN_SE·σ/√n
MAD_SIGMA = 1.4826  # σ of a normal distribution per median absolute deviation
SPREADS = 16  # windows whose spreads estimate the step noise (a few holds' worth of change)


def window_spread(periods: Sequence[float]) -> float:
    """A window's relative step noise: σ estimated from the median absolute deviation over
    the median (0 for fewer than 3 periods: no spread to speak of)."""
    if len(periods) < 3:
        return 0.0
    mid = statistics.median(periods)
    if mid <= 0.0:
        return 0.0
    return MAD_SIGMA * statistics.median(abs(p - mid) for p in periods) / mid


@dataclass
class Readings:
    """Each level's window medians (seconds) since the search last moved, and the step
    noise from every window's spread. `window`: periods a reading; `floor`: the least margin."""

    window: int
    floor: float
    levels: dict[int, list[float]] = field(default_factory=dict)
    spreads: deque[float] = field(default_factory=lambda: deque(maxlen=SPREADS))

    def record(self, periods: Sequence[float]) -> float:
        """A window's median; its spread joins the noise estimate."""
        self.spreads.append(window_spread(periods))
        return statistics.median(periods)

    def add(self, level: int, period: float) -> None:
        self.levels.setdefault(level, []).append(period)

    def replace(self, level: int, period: float) -> None:
        """`level`'s latest reading alone (a hold: older ones are from another time)."""
        self.levels[level] = [period]

    def keep(self, *levels: int) -> None:
        """Forget every other level (figures measured around an old centre are stale)."""
        self.levels = {lv: self.levels[lv] for lv in levels if lv in self.levels}

    def drop(self, level: int) -> None:
        self.levels.pop(level, None)

    def __contains__(self, level: int) -> bool:
        return level in self.levels

    def figure(self, level: int) -> float:
        """The median of `level`'s readings (interleaved ones: drift hits them alike)."""
        return statistics.median(self.levels[level])

    def count(self, level: int) -> int:
        """Periods behind `level`'s figure."""
        return len(self.levels[level]) * self.window

    def noise(self) -> float:
        """The steps' relative noise σ: the median of the recent windows' spreads."""
        return statistics.median(self.spreads) if self.spreads else 0.0

    def margin(self, n_a: int, n_b: int) -> float:
        """The relative gain that two figures of `n_a` and `n_b` periods must differ by:
        `Z` standard errors of the difference of their medians, at least `floor`."""
        se = MEDIAN_SE * self.noise() * math.sqrt(1.0 / n_a + 1.0 / n_b)
        return max(self.floor, Z * se)

    def beats(self, level: int, other: int) -> bool:
        return self.wins(self.figure(level), self.count(level), self.figure(other), self.count(other))

    def wins(self, period: float, n: int, other: float, n_other: int, factor: float = 1.0) -> bool:
        """`period` (of `n` periods) shorter than `other` (of `n_other`) by `factor` margins."""
        return period < other * (1.0 - factor * self.margin(n, n_other))

    def clear_winner(self, factor: float) -> bool:
        """Whether the fastest share (level > 0) beats every other share by `factor` margins."""
        shares = sorted((lv for lv in self.levels if lv > 0), key=self.figure)
        return len(shares) > 1 and all(
            self.wins(self.figure(shares[0]), self.count(shares[0]), self.figure(lv), self.count(lv), factor)
            for lv in shares[1:])

    def all_lose_to(self, period: float, n: int, factor: float) -> bool:
        """Whether `period` (of `n` periods) beats every share's figure by `factor` margins."""
        return all(self.wins(period, n, self.figure(lv), self.count(lv), factor) for lv in self.levels if lv > 0)

    def table(self) -> dict[int, float]:
        return {lv: self.figure(lv) for lv in sorted(self.levels)}
