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

auto (start 0, offload): a window at offload, then the informed start (`inform`: the
level q* = m·t_link / (t_link + t_cpu) where the CPU and the link finish together, from
the executor's misses and rates); a **survey** of half of the misses and q*, A B B A so
drift and the transient hit both alike, ended early once one beats the other by twice
the margin, or once offload's windows beat every share seen by twice the margin (the
shares' windows, flattered by offload's cache, would only lose by more); the **climb**
from the survey's faster share (measured again first), or at once the confirmation where
that share was no faster than offload's first window; a **confirmation** before it holds
a share: offload again, the share held only where it beats offload's best recent window
by the margin (by three on offload's first window, which the share's cache may slow).
Offload is never interleaved window by window with a share: every switch between them
starts a transient that favours the share. Every `crosscheck`-th re-check at a share is a
confirmation again (cores that got busy). A share visit far slower than offload is cut
short (`CUT`); a survey so cut starts again `RETRY_WAIT` of offload's windows later, and
`RETRY_GROWTH` times later after each cut: a cold share warms meanwhile, and a host losing
its CPU time to the hypervisor costs a few slow steps, ever more rarely.

The climb around its centre (home): the neighbours home ± stride without a fresh figure;
a move where one beats home by the margin; within the margin, both again up to `repeats`
windows, then twice as far; where home is best, a hold of a quarter of `hold` windows
doubling up to `hold` while re-checks keep it, then a fresh search. Figures from before
the last move are stale (the split shapes the cache). Elsewhere than auto's survey the
informed start is a candidate measured against the centre.

Torch-free: the executor turns levels into its quota tensor (`quota_rows`) and gathers
the informed start's numbers.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field

from edgemoe.moe.quota_levels import COUNT, LevelScale, balance_level
from edgemoe.moe.quota_readings import Readings

log = logging.getLogger(__name__)

HISTORY = 64  # windows kept for inspection: (level, median period)
OFFLOAD_READINGS = 3  # offload's latest readings kept for the confirmation (its best counts)
CONFIRM_WINDOWS = 2  # offload's windows in a confirmation, at most: the second past the switch's transient
# auto: a share visit ends after CUT_AFTER periods in a row over CUT x offload's best window, or one
# over CUT_NOW x (H100s, 2026-12-05: a stolen host's share steps ~2x offload's; four busy processes
# beside the run, 18-39 ms against 4.6); a survey so cut starts again after RETRY_WAIT of offload's
# windows, RETRY_GROWTH times more after each cut (15:50: three visits a window apart all slow)
CUT_AFTER, CUT_NOW, RETRY_WAIT, RETRY_GROWTH = 2, 4.0, 1, 8


def _cut() -> float:
    """`EDGEMOE_AUTO_CUT`: the factor over offload's window that cuts a visit (0: never), else 1.5
    (a healthy share's first steps ran up to ~1.3x offload's window on the H100s)."""
    try:
        return float(os.environ.get("EDGEMOE_AUTO_CUT", "1.5")) or float("inf")
    except ValueError:
        raise ValueError(f"EDGEMOE_AUTO_CUT must be a number (0: no cut): {os.environ['EDGEMOE_AUTO_CUT']!r}") from None


CUT = _cut()


@dataclass
class QuotaController:
    """`max_level`: the highest level (`scale.max_level`: every miss on the CPU); `start`:
    the first level (0, auto's: offload, surveyed and confirmed as above); `label`: the
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
    level: int = field(init=False)
    readings: Readings = field(init=False)
    history: deque[tuple[int, float]] = field(init=False, default_factory=lambda: deque(maxlen=HISTORY))
    windows: int = field(init=False, default=0)
    predicted: int | None = field(init=False, default=None)  # the informed start's level (`inform`)
    _home: int = field(init=False)  # the level the search is centred on
    _periods: list[float] = field(init=False, default_factory=list)
    _skip: int = field(init=False, default=0)
    _last: tuple[float, int] | None = field(init=False, default=None)  # (start time, batch size) of the last step
    _held: int = field(init=False, default=0)  # windows left in the hold
    _held_at: int | None = field(init=False, default=None)  # the level of the last hold
    _hold_len: int = field(init=False, default=0)  # the last hold's windows
    _resume: int = field(init=False, default=0)  # the windows left of a hold the candidate interrupted
    _chosen: int | None = field(init=False, default=None)
    _heading: int = field(init=False, default=0)  # +1 / -1: the direction of the last move; 0: none
    _candidate: int | None = field(init=False, default=None)  # the predicted level, until its window is judged
    _auto: bool = field(init=False)  # a start at offload: survey the shares, confirm against offload
    _survey: list[int] | None = field(init=False, default=None)  # the survey's visits to come; None: none running
    _surveyed: bool = field(init=False, default=False)
    _offload: deque[float] = field(init=False, default_factory=lambda: deque(maxlen=OFFLOAD_READINGS))
    _confirm: int | None = field(init=False, default=None)  # auto, confirming: offload's windows still to come
    _confirmed: bool = field(init=False, default=False)  # auto: the home share has beaten offload's visit
    _rechecks: int = field(init=False, default=0)
    _slow: list[float] = field(init=False, default_factory=list)  # this share visit's latest periods over CUT x offload
    _cuts: int = field(init=False, default=0)  # survey visits cut so far
    _wait: int = field(init=False, default=0)  # offload's windows before a cut survey starts again

    def __post_init__(self) -> None:
        if self.max_level < 0 or not 0 <= self.start <= self.max_level:
            raise ValueError(f"quota levels 0..{self.max_level}, start {self.start}")
        self.level = self._home = self.start
        self._skip = self.settle
        self._auto = self.start == 0 and self.max_level > 0
        self.readings = Readings(self.window, self.margin)

    @property
    def half(self) -> int:
        """hybrid's start, the survey's neutral share (half of each layer's misses)."""
        return max(1, min(self.scale.hybrid_start(), self.max_level))

    def step(self, now: float, batch: int | None) -> int:
        """A step starts at `now` (seconds); `batch`: its decode batch size, or None for a
        step the share doesn't take (prompt chunks). Returns the level for this step."""
        last, self._last = self._last, (now, batch) if batch is not None else None
        if batch is None or last is None or last[1] != batch:
            return self.level  # no period to attribute (a prompt chunk, or a new batch size)
        period = now - last[0]
        if self._cut_short(period):
            return self.level
        if self._skip:
            self._skip -= 1
            return self.level
        self._periods.append(period)
        if len(self._periods) >= self.window:
            self._window_done()
        return self.level

    def _cut_short(self, period: float) -> bool:
        """auto at a share: whether this period ends the visit (`CUT`): sitting out the settle
        and a window at steps far slower than offload's only costs time. A survey's visit so
        cut restarts the survey after offload's windows (`RETRY_WAIT`, growing: a cold share
        warms meanwhile; the survey is how a winning share is found); elsewhere those
        periods are its figure."""
        if not (self._auto and self.level and self._offload and period > CUT * min(self._offload)):
            self._slow.clear()
            return False
        self._slow.append(period)
        if len(self._slow) < CUT_AFTER and period <= CUT_NOW * min(self._offload):
            return False
        steps = ", ".join(f"{p * 1e3:.1f}" for p in self._slow)
        log.info("moe %s: %s cut short: %s ms a step against offload's %.2f", self.label,
                 self.scale.describe(self.level), steps, min(self._offload) * 1e3)
        if self._survey is not None:  # offload for now (said once), the survey again later
            self._wait, self._cuts = RETRY_WAIT * RETRY_GROWTH ** self._cuts, self._cuts + 1
            self._survey, self._surveyed, self._periods = None, False, []
            self.readings.keep(0)
            self._go(0)
            self._decided(0)
        else:
            self._skip, self._periods = 0, list(self._slow)
            self._window_done()
        return True

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
        if self._auto and (self._survey is not None or not self._surveyed):
            if self._survey is not None and self.predicted not in (0, self.half):
                self._survey = [self.predicted, self.predicted, self.half]  # after the visit in progress
            return self.level
        if self.predicted != self._home:
            self._candidate, self._confirm = self.predicted, None  # a confirmation comes again after it
            self.readings.drop(self.predicted)  # measured fresh, after the settle
            self._resume, self._held = self._held, 0  # a hold already begun gives way to the candidate
            self._periods.clear()
            self._go(self.predicted)
        return self.level

    def _begin_survey(self) -> int:
        """auto, after offload's first window: the shares half and the prediction, A B B A."""
        self._surveyed = True
        p, h = self.predicted, self.half
        self._survey = [h, p, p, h] if p is not None and p not in (0, h) else [h]
        return self._survey.pop(0)

    def _survey_lost(self) -> bool:
        """The survey may end early where every share it visits has a reading and offload's
        best window beats each by twice the margin."""
        seen, measured = self.readings, bool(self._offload)
        measured = measured and all(lv in seen for lv in self._survey or ())
        return measured and seen.all_lose_to(min(self._offload), self.window, factor=2.0)

    def _end_survey(self) -> int:
        """The survey's fastest share (by the median of its windows) is where the climb
        starts — or, where even it was no faster than offload's first window, what the
        confirmation measures at once: the survey came while the cache still held offload's
        admissions, which flatters a share, so one that doesn't win then won't later."""
        self._survey, seen = None, self.readings
        best = min((lv for lv in seen.levels if lv > 0), key=seen.figure)
        self._heading, self._home = 0, best
        if self._offload and seen.figure(best) >= min(self._offload):
            seen.keep(best)
            return self._begin_confirm()
        seen.keep()  # its windows are flattered (above): measured again as the climb's centre
        return self._next()

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
        if self._confirm is not None:
            return self._confirm_next()
        if self._survey is not None:
            going = self._survey and not (self.readings.clear_winner(factor=2.0) or self._survey_lost())
            return self._survey.pop(0) if going else self._end_survey()
        if self._auto and not self._surveyed:
            if self._wait > 1:  # the window just done was the first of the wait
                self._wait -= 1
                return 0
            self._wait = 0
            return self._begin_survey()
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

    def _begin_confirm(self) -> int:
        """auto, before it holds a share (and at every `crosscheck`-th re-check): offload's
        windows against the share's figure (the climb's windows, after the survey's)."""
        self._confirm = CONFIRM_WINDOWS - 1
        return 0

    def _confirm_next(self) -> int:
        """After each of offload's windows in the confirmation: the verdict, or offload again.
        The share wins where it beats offload's best recent window (the base's included) by
        the margin — by three while offload has windows to come, its first perhaps still
        slowed by the share's cache — and loses where it doesn't beat even the latest."""
        left, seen, share = self._confirm, self.readings, self._home
        assert left is not None
        figure, n = seen.figure(share), seen.count(share)
        wins = seen.wins(figure, n, min(self._offload), self.window, factor=3.0 if left else 1.0)
        if wins or not left or not seen.wins(figure, n, self._offload[-1], self.window):
            self._confirm, self._confirmed = None, wins
            if not wins:
                self._home = 0
            return self._hold(self._home)
        self._confirm = left - 1
        return 0

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
