"""`--moe-prefetch auto`: decode prefetch on or off, whichever makes decode steps faster,
found by timing them (`PrefetchChooser`), with a graph variant for each.

Prefetch pays by how well its predictor guesses, which nothing here knows in advance: the
model's router on the previous layer's input is an approximation whose recall on a trained
model is unmeasured. On the GPU machine (fp8, 16 GiB, 2026-12-07) a perfect guess gave
x1.40 and one of recall 0.8 x0.96: a wrong guess is a whole copy on a link-bound step. So
`auto` measures: windows of decode steps with and without it, interleaved (drift hits both
alike), judged by `Readings`' noise-scaled margin (after one window each only a gap of
`CLEAR` margins: each window of the slower choice costs); a tie keeps it off (prefetch reads host
memory and uses the link that a tie hides). The verdict is held for a quarter of `hold`
windows (all of `hold` where it won by `CLEAR` margins), then for twice as long while
re-checks keep it, up to `hold`; each re-check
measures both again, since routing, batch sizes and the CPU share's level change what it
is worth.

The measured periods are those of `QuotaController` (`moe/step_periods.py`): between the
starts of consecutive decode steps of the same batch size. While the chooser measures, the executor pauses the
live quota's controller (its level fixed), so neither reads the other's switches as its own.

Torch-free; the executor switches graph variants by the verdict (`prefetch_variant`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from edgemoe.moe.quota_readings import Readings
from edgemoe.moe.step_periods import StepPeriods

log = logging.getLogger(__name__)

PREFETCH = "prefetch"  # the variant tag of graphs captured with prefetch
OFF, ON = 0, 1  # the readings' keys
CLEAR = 3.0  # margins a one-window-each verdict must win by


def prefetch_variant(base: str | None, on: bool) -> str | None:
    """The graph variant of `base` (the CPU share's, or None) with prefetch on or off."""
    if not on:
        return base
    return PREFETCH if base is None else f"{base}+{PREFETCH}"


def split_variant(variant: str | None) -> tuple[str | None, bool]:
    """(base, prefetch on) of a variant `prefetch_variant` named."""
    if variant == PREFETCH:
        return None, True
    if variant is not None and variant.endswith(f"+{PREFETCH}"):
        return variant[: -len(PREFETCH) - 1], True
    return variant, False


def with_prefetch(variants: tuple[str | None, ...]) -> tuple[str | None, ...]:
    """Every variant with prefetch off and on."""
    return tuple(prefetch_variant(base, on) for base in variants for on in (False, True))


@dataclass
class PrefetchChooser:
    """`window` periods a reading; `rounds` readings of each before a verdict, up to
    `max_rounds` while they differ within the noise; `settle` steps skipped after a switch
    (the copies in flight, the cache turning over); `hold`: the longest hold, in windows of
    steps. `step` before each step; `on` is the choice for it."""

    window: int = 8
    rounds: int = 2
    max_rounds: int = 4
    settle: int = 2
    hold: int = 64
    margin: float = 0.02
    on: bool = field(init=False, default=True)  # the first window measures prefetch on
    verdict: bool | None = field(init=False, default=None)  # the held choice; None while measuring
    readings: Readings = field(init=False)
    windows: int = field(init=False, default=0)
    verdicts: int = field(init=False, default=0)
    _periods: list[float] = field(init=False, default_factory=list)
    _steps: StepPeriods = field(init=False, default_factory=StepPeriods)
    _skip: int = field(init=False, default=0)
    _held: int = field(init=False, default=0)  # decode steps left in the hold
    _hold_len: int = field(init=False, default=0)  # the last hold's windows
    _told: bool | None = field(init=False, default=None)  # the choice the log last said

    def __post_init__(self) -> None:
        if not 1 <= self.rounds <= self.max_rounds or self.window < 1 or self.hold < 1:
            raise ValueError(f"prefetch chooser: window {self.window}, rounds {self.rounds}..{self.max_rounds}, "
                             f"hold {self.hold}")
        self.readings = Readings(self.window, self.margin)
        self._skip = self.settle

    @property
    def measuring(self) -> bool:
        return self.verdict is None

    def step(self, now: float, batch: int | None, may_recheck: bool = True) -> bool:
        """A step starts at `now` (seconds); `batch`: its decode batch size, or None for a
        step prefetch doesn't cover (prompt chunks, batches above its rows); `may_recheck`:
        whether a re-check may begin now (the live quota holds a level: a re-check at a
        level it is only visiting would judge prefetch where the quota won't stay). Returns
        whether the chooser measures this step (the quota controller then sits it out)."""
        period = self._steps.period(now, batch)
        if self.verdict is not None:
            if batch is not None:
                self._held -= 1
                if self._held <= 0 and may_recheck:
                    self._measure_again()
            return self.measuring
        if period is None:
            return True  # no period to attribute (a prompt chunk, or a new batch size)
        if self._skip:
            self._skip -= 1
            return True
        self._periods.append(period)
        if len(self._periods) >= self.window:
            self._window_done()
        return True

    def _window_done(self) -> None:
        self.readings.add(ON if self.on else OFF, self.readings.record(self._periods))
        self._periods.clear()
        self.windows += 1
        on, off = (self.readings.count(k) // self.window if k in self.readings else 0 for k in (ON, OFF))
        if min(on, off) >= 1 and on == off:
            decided = self._judge(on)
            if decided is not None:
                self._decide(decided, clear=self._wins(ON, OFF, CLEAR) or self._wins(OFF, ON, CLEAR))
                return
        self._switch(not self.on)

    def _judge(self, rounds: int) -> bool | None:
        """The verdict once both have `rounds` readings: before `rounds` of them only a
        clear one (`CLEAR` margins: a gap like the oracle's 28% shows in one window each,
        and every window of the slower choice costs); from `rounds` on the faster by the
        margin; within it, more rounds up to `max_rounds`, then off."""
        factor = CLEAR if rounds < self.rounds else 1.0
        if self._wins(ON, OFF, factor):
            return True
        if self._wins(OFF, ON, factor) or rounds >= self.max_rounds:
            return False
        return None

    def _wins(self, a: int, b: int, factor: float) -> bool:
        r = self.readings
        return r.wins(r.figure(a), r.count(a), r.figure(b), r.count(b), factor)

    def _decide(self, on: bool, clear: bool) -> None:
        """Hold `on`: a quarter of `hold` windows where the verdict is new, twice the last
        hold (up to `hold`) where a re-check kept it; the whole of `hold` where it won by
        `CLEAR` margins (`clear`: a gap that wide doesn't close soon, and each re-check costs
        a window of the slower choice and the transient after it: on the GPU machine ~0.96 of
        the better setting over 512 steps with a quarter hold first)."""
        first = self.hold if clear else max(1, self.hold // 4)
        doubled = min(2 * self._hold_len, self.hold) if on == self._told else 0
        self._hold_len = max(first, doubled)
        self._held = self._hold_len * self.window
        self.verdict, self.verdicts = on, self.verdicts + 1
        self._switch(on)
        self._tell(on)

    def _measure_again(self) -> None:
        """A re-check: both measured afresh, the held choice first (no switch yet)."""
        self.verdict = None
        self.readings.keep()
        self._periods.clear()
        self._skip = self.settle

    def _switch(self, on: bool) -> None:
        if on != self.on:
            self._skip = self.settle
            self._periods.clear()
        self.on = on

    def _tell(self, on: bool) -> None:
        """One log line when the settled choice changes."""
        if on == self._told:
            return
        self._told = on
        figures = self.table()
        log.warning("decode prefetch auto: %s (a decode step %.2f ms with prefetch, %.2f ms without)",
                    "on" if on else "off", figures["on"], figures["off"])

    def table(self) -> dict[str, float]:
        """The latest figures (ms a step) by choice."""
        return {name: round(self.readings.figure(key) * 1e3, 3)
                for name, key in (("on", ON), ("off", OFF)) if key in self.readings}

    def snapshot(self) -> dict[str, object]:
        return {"prefetch_auto": "measuring" if self.measuring else ("on" if self.verdict else "off"),
                "prefetch_auto_step_ms": self.table(), "prefetch_auto_windows": self.windows,
                "prefetch_auto_verdicts": self.verdicts}
