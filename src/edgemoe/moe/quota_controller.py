"""The live quota of the device cache's CPU share: how many of each MoE layer's misses the
CPU computes, found by timing decode steps (`--moe-backend hybrid|auto` on the device
cache without a fixed `--cpu-experts-per-layer`).

Inside a captured decode step nothing runs on the host, so the split can't be set per
layer from that layer's timings as the host cache's controller does (`moe/controller.py`).
What the host sees is whole steps: it times the period between the starts of consecutive
decode steps of the same batch size (with the overlap scheduler, the device's step time
once the queue is full) and rewrites the per-layer quota between steps (a device copy,
stream-ordered: no re-capture, no sync). The search variable is a level
(`moe/quota_levels.py`: sixteenths of each layer's misses, or quarter experts); level 0 is
offload exactly (the executor then replays graphs captured without the share).

A window is `window` periods after a switch's settle; its median is a reading, and a
level beats another only by a margin scaled with the steps' measured noise, never below
`margin` (`moe/quota_readings.py`). A switch has a transient (the cache still holds what
the previous level admitted: right after offload a large share looks faster than it
will be), so it skips `settle` steps plus `switch_settle` × its part of the range; and
the step time is not convex in the level (fp8: offload 9.08 ms, 2/16 9.36, 8/16 ~7.9), so
a climb from offload never reaches the share that wins. docs/offload.md ("The quota,
live") has the rules below with the GPU machine's readings and the simulator's figures.

auto (start 0, offload) adds a survey of shares, a confirmation against offload and
cut-short visits (`moe/quota_auto.py`, mixed in). The informed start (`inform`, once,
after the first window) is the level q* = m·t_link / (t_link + t_cpu) where the CPU and
the link finish together, from the executor's misses and rates: auto's survey takes it
as its second share; elsewhere it is a candidate measured against the centre.

The climb around its centre (home): the neighbours home ± stride without a fresh figure;
a move where one beats home by the margin; within the margin, both again up to `repeats`
windows, then twice as far; where home is best, a hold of a quarter of `hold` windows
doubling up to `hold` while re-checks keep it, then a fresh search. Figures from before
the last move are stale (the split shapes the cache).

Torch-free: the executor turns levels into its quota tensor (`quota_rows`) and gathers
the informed start's numbers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from edgemoe.moe.host_load import HostLoad, busy_cores_limit
from edgemoe.moe.quota_auto import AutoSearch
from edgemoe.moe.quota_levels import COUNT, LevelScale, balance_level
from edgemoe.moe.quota_readings import Readings
from edgemoe.moe.step_periods import StepPeriods

log = logging.getLogger(__name__)

HISTORY = 64  # windows kept for inspection: (level, median period)


@dataclass
class QuotaController(AutoSearch):
    """`max_level`: the highest level (`scale.max_level`: every miss on the CPU); `start`:
    the first level (0, auto's: offload, then `moe/quota_auto.py`'s search); `label`: the
    backend, for the log line; `scale`: what a level means. `step` each step; `inform`
    once, with the rates (the informed start, above)."""

    max_level: int
    start: int = 0
    scale: LevelScale = COUNT
    window: int = 8
    settle: int = 1
    switch_settle: int = 16  # more steps skipped after a switch, in proportion to its part of the range
    stride: int = 2
    margin: float = 0.02  # the least margin; the measured noise may ask more (`Readings.margin`)
    hold: int = 16  # the longest hold, in windows (a level held anew: a quarter of it)
    repeats: int = 3  # windows a level and home may take each where one is faster within the noise
    crosscheck: int = 4  # auto: every this many re-checks at a share compare it with offload again
    label: str = "hybrid"
    # auto: others' busy cores (`moe/host_load.py`; None: not known) and the most a share is tried beside
    host_load: Callable[[], float | None] | None = None
    busy_cores: float = float("inf")
    level: int = field(init=False)
    readings: Readings = field(init=False)
    history: deque[tuple[int, float]] = field(init=False, default_factory=lambda: deque(maxlen=HISTORY))
    windows: int = field(init=False, default=0)
    predicted: int | None = field(init=False, default=None)  # the informed start's level (`inform`)
    _home: int = field(init=False)  # the level the search is centred on
    _periods: list[float] = field(init=False, default_factory=list)
    _skip: int = field(init=False, default=0)
    _steps: StepPeriods = field(init=False, default_factory=StepPeriods)
    _held: int = field(init=False, default=0)  # windows left in the hold
    _held_at: int | None = field(init=False, default=None)  # the level of the last hold
    _hold_len: int = field(init=False, default=0)  # the last hold's windows
    _resume: int = field(init=False, default=0)  # the windows left of a hold the candidate interrupted
    _chosen: int | None = field(init=False, default=None)
    _heading: int = field(init=False, default=0)  # +1 / -1: the direction of the last move; 0: none
    _candidate: int | None = field(init=False, default=None)  # the predicted level, until its window is judged
    _rechecks: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.max_level < 0 or not 0 <= self.start <= self.max_level:
            raise ValueError(f"quota levels 0..{self.max_level}, start {self.start}")
        self.level = self._home = self.start
        self._skip = self.settle
        self._auto = self.start == 0 and self.max_level > 0
        self.readings = Readings(self.window, self.margin)

    @classmethod
    def live(cls, **settings) -> QuotaController:  # noqa: ANN003
        """An engine's controller: auto's (start 0) watches this host's load, so it tries no
        CPU share while other work holds the cores (`EDGEMOE_AUTO_BUSY_CORES`)."""
        ctl = cls(**settings)
        if ctl._auto:
            ctl.host_load, ctl.busy_cores = HostLoad().others, busy_cores_limit()
        return ctl

    @property
    def half(self) -> int:
        """hybrid's start, the survey's neutral share (half of each layer's misses)."""
        return max(1, min(self.scale.hybrid_start(), self.max_level))

    def step(self, now: float, batch: int | None) -> int:
        """A step starts at `now` (seconds); `batch`: its decode batch size, or None for a
        step the share doesn't take (prompt chunks). Returns the level for this step."""
        period = self._steps.period(now, batch)
        if period is None:
            return self.level  # no period to attribute (a prompt chunk, or a new batch size)
        if self._cut_short(period):
            return self.level
        if self._skip:
            self._skip -= 1
            return self.level
        self._periods.append(period)
        if len(self._periods) >= self.window:
            self._window_done()
        return self.level

    @property
    def holding(self) -> bool:
        """Whether a level is held (between searches)."""
        return self._held > 0

    def pause(self) -> None:
        """A step this controller sits out (`--moe-prefetch auto` measures it): no period
        spans it, and a window begun before it starts again."""
        self._steps.forget()
        self._periods.clear()

    def _window_done(self) -> None:
        period = self.readings.record(self._periods)
        self._periods.clear()
        self.windows += 1
        self.history.append((self.level, period))
        if self._auto and self.level == 0:
            self._offload.append(period)
        if self._held:  # holding at home: one window less, then search afresh around it
            self.readings.replace(self.level, period)
            self._held -= 1
            if not self._held:
                self._go(self._recheck())
            return
        self.readings.add(self.level, period)
        self._go(self._next())

    def _recheck(self) -> int:
        """After a hold: auto at a share compares it with offload every `crosscheck`-th time
        (the cores may have got busy, which no neighbour shows on a curve with a hump
        between); else the neighbours, around home's latest window."""
        self._rechecks += 1
        self.readings.keep(self._home)
        if self._auto and self._home and self._rechecks % self.crosscheck == 0:
            self._offload.clear()  # offload's old readings are from before the change looked for
            return self._begin_confirm()
        return self._next()

    def inform(self, misses: float, link_s: float, cpu_s: float) -> int:
        """The informed start (once; later calls change nothing): auto's survey takes the
        balance level (`balance_level`) among its shares; elsewhere it is measured next,
        as a candidate against the current centre. Returns the level for the coming step."""
        if self.predicted is not None:
            return self.level
        self.predicted = balance_level(misses, link_s, cpu_s, self.max_level, self.scale)
        log.info("moe %s: rates put the CPU's balance at %s (level %d): %.2f misses a layer a "
                 "decode step, %.3f ms a copy, %.3f ms a CPU expert (the search's centre: %s)", self.label,
                 self.scale.describe(self.predicted), self.predicted, misses, link_s * 1e3, cpu_s * 1e3,
                 self.scale.describe(self._home))
        if self._survey_takes_prediction():
            return self.level
        if self.predicted != self._home:
            self._candidate, self._confirm = self.predicted, None  # a confirmation comes again after it
            self.readings.drop(self.predicted)  # measured fresh, after the settle
            self._resume, self._held = self._held, 0  # a hold already begun gives way to the candidate
            self._periods.clear()
            self._go(self.predicted)
        return self.level

    def _judge_candidate(self) -> int | None:
        """Once the predicted level has its window: the search's next level from it when it
        beats the centre (or the centre has no figure yet); else the centre again for the
        rest of a hold it interrupted, or None (its figure dropped: the search goes on
        around the centre as if it had never been measured)."""
        cand = self._candidate
        if cand is None or cand not in self.readings:
            return None
        self._candidate = None
        resume, self._resume = self._resume, 0
        if self._home not in self.readings or self.readings.beats(cand, self._home):
            return self._move(cand)
        self.readings.drop(cand)
        if resume:  # it interrupted a hold: the rest of the hold
            self._held = resume
            return self._home
        return None

    def _next(self) -> int:
        """The next level to measure, or the level to hold."""
        auto = self._auto_next()
        if auto is not None:
            return auto
        judged = self._judge_candidate()
        return judged if judged is not None else self._climb()

    def _climb(self) -> int:
        """The hill climb around home: its next level to measure, or the level to hold."""
        home, seen = self._home, self.readings
        if home not in seen:
            return home
        ahead = home + self._heading * self.stride
        if self._heading and ahead in seen and seen.beats(ahead, home):
            return self._move(ahead)  # still going downhill: the level behind just lost
        for nb in (ahead, home - self._heading * self.stride) if self._heading else \
                (home + self.stride, home - self.stride):
            if 0 <= nb <= self.max_level and nb not in seen:
                return nb
        best = min(seen.levels, key=seen.figure)
        if best != home and seen.beats(best, home):
            return self._move(best)
        if best != home:  # faster within the noise: both again, interleaved, until it tells or enough
            again = min((home, best), key=seen.count)
            if seen.count(again) < self.repeats * self.window:
                return again
        stretch = home + 2 * (best - home)  # a shallow slope: look twice as far down it
        if best != home and abs(best - home) == self.stride and 0 <= stretch <= self.max_level \
                and stretch not in seen:
            return stretch
        if self._auto and home and not self._confirmed:
            return self._begin_confirm()
        return self._hold(home)

    def _hold(self, home: int) -> int:
        """Hold `home`: a quarter of `hold` windows where it is new, twice the last hold
        (up to `hold`) where a re-check kept it — a noisy first verdict is soon looked at
        again, a settled one costs little."""
        first = max(1, self.hold // 4)
        self._hold_len = min(2 * self._hold_len, self.hold) if home == self._held_at else first
        self._held_at, self._held, self._heading = home, self._hold_len, 0
        self._decided(home)
        return home

    def _move(self, level: int) -> int:
        """Centre the search on `level`; figures around the old home are stale."""
        if self._home == 0 and level:
            self._confirmed = False  # a share reached from offload by a climb: to be confirmed
        self._heading = 1 if level > self._home else -1
        self._home = level
        self.readings.keep(level)
        return self._next()

    def _go(self, level: int) -> None:
        """Measure `level` next: a switch skips `settle` steps and more the farther it goes,
        while the cache's content turns over to what the new level admits."""
        if level != self.level:
            self._skip = self.settle + round(self.switch_settle * abs(level - self.level) / max(self.max_level, 1))
            self._slow.clear()
        self.level = level

    def _decided(self, level: int) -> None:
        """One log line when the settled choice changes (offload vs the CPU's share)."""
        if level == self._chosen:
            return
        self._chosen = level
        table = ", ".join(f"{self.scale.value(lv):g}: {t * 1e3:.2f} ms" for lv, t in self.readings.table().items())
        if level == 0:
            log.warning("moe %s: offload (no CPU share): a decode step was fastest without one (%s)", self.label, table)
        else:
            log.warning("moe %s: the CPU computes %s (a decode step's time by %s: %s)",
                        self.label, self.scale.describe(level), self.scale.unit, table)

    def snapshot(self) -> dict[str, object]:
        """For the statistics: the level in use, the settled one, the latest figures."""
        return {
            "cpu_quota_unit": self.scale.unit,
            "cpu_quota_per_layer": self.scale.value(self.level),
            "cpu_quota_settled": None if self._chosen is None else self.scale.value(self._chosen),
            "cpu_quota_step_ms": {f"{self.scale.value(lv):g}": round(t * 1e3, 3)
                                  for lv, t in self.readings.table().items()},
            "cpu_quota_windows": self.windows,
            # each window's level and median period, oldest first (the last HISTORY): how the search went
            "cpu_quota_history": [[self.scale.value(lv), round(t * 1e3, 3)] for lv, t in self.history],
            "cpu_quota_start_per_layer": None if self.predicted is None else self.scale.value(self.predicted),
        }
