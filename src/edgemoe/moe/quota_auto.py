"""auto's own search (`--moe-backend auto` on the device cache): the survey, the
confirmation against offload and the cut-short visit, mixed into the live quota's
controller (`moe/quota_controller.py`: the windows, the climb and the hold).

auto starts at offload (level 0): a window there, then the informed start (the level q*
where the CPU and the link finish together, from the executor's misses and rates); a
**survey** of half of the misses and q*, A B B A so drift and the transient hit both
alike, ended early once one beats the other by twice the margin, or once offload's
windows beat every share seen by twice the margin (the shares' windows, flattered by
offload's cache, would only lose by more); the climb from the survey's faster share
(measured again first), or at once the confirmation where that share was no faster than
offload's first window; a **confirmation** before it holds a share: offload again, the
share held only where it beats offload's best recent window by the margin (by three on
offload's first window, which the share's cache may slow). Offload is never interleaved
window by window with a share: every switch between them starts a transient that
favours the share. Every `crosscheck`-th re-check at a share is a confirmation again
(cores that got busy). A share visit far slower than offload is **cut short** (`CUT`,
`CUT_NOW`); a survey so cut starts again `RETRY_WAIT` of offload's windows later, and
`RETRY_GROWTH` times later after each cut: a cold share warms meanwhile, and a host
losing its CPU time costs a few slow steps, ever more rarely. docs/offload.md ("The
quota, live") has the GPU machine's readings and the simulator's figures.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemoe.moe.quota_levels import LevelScale
    from edgemoe.moe.quota_readings import Readings

log = logging.getLogger(__name__)

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
    raw = os.environ.get("EDGEMOE_AUTO_CUT", "1.5")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # NOTE: a negative factor cut every visit, nan none
        raise ValueError(f"EDGEMOE_AUTO_CUT must be a number >= 0 (0: no cut): {raw!r}")
    return value or float("inf")


CUT = _cut()


@dataclass
class AutoSearch:
    """auto's state and steps, for `QuotaController` (which it is mixed into: the methods
    use its level, readings, search centre and moves)."""

    _auto: bool = field(init=False, default=False)  # a start at offload: survey the shares, confirm against offload
    _survey: list[int] | None = field(init=False, default=None)  # the survey's visits to come; None: none running
    _surveyed: bool = field(init=False, default=False)
    _offload: deque[float] = field(init=False, default_factory=lambda: deque(maxlen=OFFLOAD_READINGS))
    _confirm: int | None = field(init=False, default=None)  # confirming: offload's windows still to come
    _confirmed: bool = field(init=False, default=False)  # the home share has beaten offload's visit
    _slow: list[float] = field(init=False, default_factory=list)  # this share visit's latest periods over CUT x offload
    _cuts: int = field(init=False, default=0)  # survey visits cut so far
    _wait: int = field(init=False, default=0)  # offload's windows before a cut survey starts again
    _busy: bool = field(init=False, default=False)  # other work held the cores at the last look
    _busy_told: bool = field(init=False, default=False)  # said as a warning once; later turns at INFO

    if TYPE_CHECKING:  # QuotaController's, which the steps below read and move (not fields here)
        level: int
        readings: Readings
        window: int
        label: str
        scale: LevelScale
        predicted: int | None
        host_load: Callable[[], float | None] | None
        busy_cores: float
        _home: int
        _heading: int
        _periods: list[float]
        _skip: int
        half: int

        def _go(self, level: int) -> None: ...
        def _hold(self, home: int) -> int: ...
        def _decided(self, level: int) -> None: ...
        def _window_done(self) -> None: ...
        def _next(self) -> int: ...

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

    def _auto_next(self) -> int | None:
        """auto's next level while it confirms, surveys or waits to survey again; None:
        the climb's turn."""
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
            return 0 if self._host_busy() else self._begin_survey()
        return None

    def _host_busy(self) -> bool:
        """Whether other work holds more than `busy_cores` of this process's cores
        (`moe/host_load.py`): then offload's window again, no share visit — a share's workers
        would queue behind that work (said when it starts and when it ends)."""
        others = self.host_load() if self.host_load is not None else None
        busy = others is not None and others > self.busy_cores
        if others is not None and busy != self._busy:
            told = log.warning if busy and not self._busy_told else log.info  # a user sees the first time
            if busy:
                told("moe %s: other work keeps %.1f of this process's cores busy: offload, no CPU share tried until "
                     "they are free (EDGEMOE_AUTO_BUSY_CORES=%g)", self.label, others, self.busy_cores)
            else:
                log.info("moe %s: the cores are free again (%.1f busy with other work): trying CPU shares",
                         self.label, others)
            self._busy, self._busy_told = busy, self._busy_told or busy
        return busy

    def _survey_takes_prediction(self) -> bool:
        """At `inform`: whether auto's survey (begun or to come) takes the prediction as
        its second share, rather than the search measuring it as a candidate."""
        if not (self._auto and (self._survey is not None or not self._surveyed)):
            return False
        if self._survey is not None and self.predicted not in (0, self.half):
            self._survey = [self.predicted, self.predicted, self.half]  # after the visit in progress
        return True

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
