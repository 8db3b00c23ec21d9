"""The live quota of the device cache's CPU share: how many of each MoE layer's misses the
CPU computes, found by timing decode steps (`--moe-backend hybrid|auto` on the device
cache without a fixed `--cpu-experts-per-layer`).

Inside a captured decode step nothing runs on the host, so the split can't be set per
layer from that layer's timings as the host cache's controller does (`moe/controller.py`).
What the host sees is whole steps: it times the period between the starts of consecutive
decode steps of the same batch size (with the overlap scheduler, the device's step time
once the queue is full) and rewrites the per-layer quota between steps (a device copy,
stream-ordered: no re-capture, no sync).

The search variable is a level: a quarter of an expert a layer, `quota[l] = (level + l
mod 4) // 4`, so levels between whole experts mix two quotas across the layers. Level 0
is offload exactly (the executor then replays graphs captured without the share). The
controller hill-climbs on the median period of a window of steps:
- a window measures one level (`window` periods, after `settle` steps that may still
  overlap the previous level's work);
- from the current level it measures the neighbours `level ± stride` that have no fresh
  figure, then moves to the best of the three when it beats the current by `margin`;
- after a move it measures the next level the same way first and moves on at once when
  that beats the current by `margin` (the level behind it just lost): a far optimum costs
  a window a stride, not two (Qwen3.8 settled at 6.5 of its ~9 misses a layer, 11
  strides from the start at one: ~25 windows before, ~15 now);
- where a neighbour is faster but by less than `margin` (a shallow slope: Qwen3.8's
  ~1.6% a half expert between 3 and 6.5 experts a layer), it measures twice as far that
  way before holding, so gains too small to tell from noise a stride apart are still
  found two strides apart;
- when the current level is best it holds for `hold` windows, then forgets its figures
  and searches again, so a change (another process on the cores, a new routing mix,
  longer contexts) is found, not locked in. Exploring costs a window at a neighbour per
  `hold` windows: with the defaults ~1–2% of decode time at worst.
Figures older than the last move are stale: a level's time depends on the cache, which
the split itself shapes, so only figures measured around the current level are compared.

The informed start (`inform`, once): climbing from the start alone took Qwen3.8 ~100–200
decode steps, and a fresh engine's first request ran slow meanwhile. After the first
window the executor measures what the balance needs: m, the misses a layer a decode step
(the CPU's included), a copy's seconds (t_link: an expert's bytes over the link) and a
CPU expert's at one token (t_cpu, the share's fitted rate). The CPU and the link finish
together at q* = m·t_link / (t_link + t_cpu) experts a layer; the controller measures
that level next, as a candidate against the current centre (the start), and centres the
search there when it beats the centre by `margin` — else it goes back and climbs as
before. A candidate rather than a plain jump so that auto (start 0: offload) can never
settle slower than offload on a wrong prediction: the predicted level must win a window
against level 0 first. For hybrid (start one expert a layer) it is the jump whenever the
prediction is any good. Either way the hill-climb refines from where it lands.

Torch-free: the executor turns levels into its quota tensor (`quota_rows`) and gathers
the informed start's numbers.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

QUARTERS = 4  # levels per expert (the count scale)
SIXTEENTHS = 16  # levels of the whole of a layer's misses (the fraction scale; kernels/share_split.FRACTION_ONE)
HISTORY = 64  # windows kept for inspection: (level, median period)


@dataclass(frozen=True)
class LevelScale:
    """What a level means (`CountScale`, `FractionScale`): `per_unit` levels a unit of
    `unit`; each level's per-layer quota and fraction for the share's tensors (`rows`,
    `fraction`), and the levels' range and hybrid's start."""

    name: str
    per_unit: int  # levels a unit
    unit: str  # what a unit is, for the log and the statistics

    def value(self, level: int) -> float:
        return level / self.per_unit

    def describe(self, level: int) -> str:
        raise NotImplementedError

    def max_level(self, top_k: int) -> int:
        """Every miss on the CPU (a decode token misses at most top-k a layer)."""
        raise NotImplementedError

    def hybrid_start(self) -> int:
        """hybrid's first level (auto starts at 0: offload)."""
        raise NotImplementedError

    def rows(self, level: int, num_layers: int, experts: int) -> list[int]:
        """Each layer's quota (a cap on its CPU experts) at `level`."""
        raise NotImplementedError

    def fraction(self, level: int) -> int:
        """The share of each layer's misses the CPU may take at `level`, in sixteenths."""
        raise NotImplementedError

    def taken(self, misses: float, part: float) -> float:
        """The level's units where a layer that misses `misses` gives the CPU `part` of them."""
        raise NotImplementedError


class CountScale(LevelScale):
    """`level` quarters of an expert a layer on average, the same count whatever a layer
    missed (`quota_rows`); the fraction is the whole."""

    def describe(self, level: int) -> str:
        return f"{self.value(level):g} misses a layer"

    def max_level(self, top_k: int) -> int:
        return self.per_unit * top_k

    def hybrid_start(self) -> int:
        return self.per_unit  # one expert a layer

    def rows(self, level: int, num_layers: int, experts: int) -> list[int]:
        return quota_rows(level, num_layers)

    def fraction(self, level: int) -> int:
        return SIXTEENTHS

    def taken(self, misses: float, part: float) -> float:
        return misses * part


class FractionScale(LevelScale):
    """`level` sixteenths of each layer's own misses (`kernels/share_split.decode_take`): a
    layer that missed 4 gives the CPU more than one that missed 2, so each layer's CPU call
    and copies end closer together — a layer's time is the later of the two, and a fixed
    count leaves the CPU the longer side where a layer missed few and the link where it
    missed many (docs/offload.md, "The split by each layer's misses"). No count cap."""

    def describe(self, level: int) -> str:
        return f"{level}/{self.per_unit} of each layer's misses"

    def max_level(self, top_k: int) -> int:
        return self.per_unit

    def hybrid_start(self) -> int:
        return self.per_unit // 2  # half of each layer's misses

    def rows(self, level: int, num_layers: int, experts: int) -> list[int]:
        return [experts if level else 0] * num_layers

    def fraction(self, level: int) -> int:
        return level

    def taken(self, misses: float, part: float) -> float:
        return part


COUNT = CountScale("count", QUARTERS, "CPU experts a layer")
FRACTION = FractionScale("fraction", SIXTEENTHS, "the share of each layer's misses on the CPU")
SCALES = {s.name: s for s in (COUNT, FRACTION)}


def share_scale() -> LevelScale:
    """The live share's scale: `EDGEMOE_SHARE_SPLIT` (fraction, the default; count: the
    same number of CPU experts in every layer, as before 2026-12-04) — for an A/B."""
    name = os.environ.get("EDGEMOE_SHARE_SPLIT", FRACTION.name)
    if name not in SCALES:
        raise ValueError(f"EDGEMOE_SHARE_SPLIT must be one of {', '.join(SCALES)} (got {name!r})")
    return SCALES[name]


def quota_rows(level: int, num_layers: int) -> list[int]:
    """The per-layer quota of a count level: `level` quarters of an expert a layer on average."""
    return [(level + layer % QUARTERS) // QUARTERS for layer in range(num_layers)]


def balance_level(misses: float, link_s: float, cpu_s: float, max_level: int, scale: LevelScale = COUNT) -> int:
    """The level where a layer's CPU experts take as long as its copies of the rest:
    q·t_cpu = (m − q)·t_link, so q* = m·t_link / (t_link + t_cpu) — in quarters of an
    expert (count), or the part t_link / (t_link + t_cpu) of the misses in sixteenths
    (fraction; 0 where nothing is missed) — within 0..max_level. `misses`: m, a layer's
    misses a decode step; `link_s`, `cpu_s`: one expert's copy and one CPU expert at one
    token, seconds."""
    if link_s + cpu_s <= 0.0 or misses <= 0.0:
        return 0
    return min(max(round(scale.per_unit * scale.taken(misses, link_s / (link_s + cpu_s))), 0), max_level)


@dataclass
class QuotaController:
    """`max_level`: the highest level (`scale.max_level`: every miss on the CPU); `start`:
    the first level; `label`: the backend, for the log line; `scale`: what a level means.
    `step` each step; `inform` once, with the rates (the informed start, above)."""

    max_level: int
    start: int = 0
    scale: LevelScale = COUNT
    window: int = 8
    settle: int = 1
    stride: int = 2
    margin: float = 0.02
    hold: int = 16
    label: str = "hybrid"
    level: int = field(init=False)
    figures: dict[int, float] = field(init=False, default_factory=dict)  # level -> median period (s), fresh
    history: deque[tuple[int, float]] = field(init=False, default_factory=lambda: deque(maxlen=HISTORY))
    windows: int = field(init=False, default=0)
    _home: int = field(init=False)  # the level the search is centred on
    _periods: list[float] = field(init=False, default_factory=list)
    _skip: int = field(init=False, default=0)
    _last: tuple[float, int] | None = field(init=False, default=None)  # (start time, batch size) of the last step
    _held: int = field(init=False, default=0)
    _chosen: int | None = field(init=False, default=None)
    _heading: int = field(init=False, default=0)  # +1 / -1: the direction of the last move; 0: none
    predicted: int | None = field(init=False, default=None)  # the informed start's level (`inform`)
    _candidate: int | None = field(init=False, default=None)  # the predicted level, until its window is judged

    def __post_init__(self) -> None:
        if self.max_level < 0 or not 0 <= self.start <= self.max_level:
            raise ValueError(f"quota levels 0..{self.max_level}, start {self.start}")
        self.level = self._home = self.start
        self._skip = self.settle

    def step(self, now: float, batch: int | None) -> int:
        """A step starts at `now` (seconds); `batch`: its decode batch size, or None for a
        step the share doesn't take (prompt chunks). Returns the level for this step."""
        last, self._last = self._last, (now, batch) if batch is not None else None
        if batch is None or last is None or last[1] != batch:
            return self.level  # no period to attribute (a prompt chunk, or a new batch size)
        if self._skip:
            self._skip -= 1
            return self.level
        self._periods.append(now - last[0])
        if len(self._periods) >= self.window:
            self._window_done(statistics.median(self._periods))
        return self.level

    def _window_done(self, period: float) -> None:
        self._periods.clear()
        self.windows += 1
        self.history.append((self.level, period))
        self.figures[self.level] = period
        if self._held:  # holding at home: one window less, then search afresh around it
            self._held -= 1
            if self._held:
                return
            self.figures = {self._home: period}
        self._go(self._next())

    def inform(self, misses: float, link_s: float, cpu_s: float) -> int:
        """The informed start (once; later calls change nothing): measure the balance level
        (`balance_level`) next, as a candidate against the current centre. Returns the
        level for the coming step."""
        if self.predicted is not None:
            return self.level
        self.predicted = balance_level(misses, link_s, cpu_s, self.max_level, self.scale)
        log.info("moe %s: rates put the CPU's balance at %s (level %d): %.2f misses a layer a "
                 "decode step, %.3f ms a copy, %.3f ms a CPU expert (the search's centre: %s)", self.label,
                 self.scale.describe(self.predicted), self.predicted, misses, link_s * 1e3, cpu_s * 1e3,
                 self.scale.describe(self._home))
        if self.predicted != self._home:
            self._candidate = self.predicted
            self.figures.pop(self.predicted, None)  # measured fresh, after the settle
            self._held = 0  # a hold already begun gives way to the candidate
            self._periods.clear()
            self._go(self.predicted)
        return self.level

    def _judge_candidate(self) -> int | None:
        """Once the predicted level has its window: the search's next level from it when it
        beats the centre (or the centre has no figure yet), else None (its figure dropped:
        the search goes on around the centre as if it had never been measured)."""
        cand = self._candidate
        if cand is None or cand not in self.figures:
            return None
        self._candidate = None
        if self._home not in self.figures or self._beats(cand, self._home):
            return self._move(cand)
        del self.figures[cand]
        return None

    def _next(self) -> int:
        """The next level to measure, or the home level to hold."""
        judged = self._judge_candidate()
        if judged is not None:
            return judged
        home = self._home
        ahead = home + self._heading * self.stride
        if self._heading and ahead in self.figures and self._beats(ahead, home):
            return self._move(ahead)  # still going downhill: the level behind just lost
        for nb in (ahead, home - self._heading * self.stride) if self._heading else \
                (home + self.stride, home - self.stride):
            if 0 <= nb <= self.max_level and nb not in self.figures:
                return nb
        best = min(self.figures, key=lambda lv: self.figures[lv])
        if best != home and self._beats(best, home):
            return self._move(best)
        stretch = home + 2 * (best - home)  # a shallow slope: look twice as far down it
        if best != home and abs(best - home) == self.stride and 0 <= stretch <= self.max_level \
                and stretch not in self.figures:
            return stretch
        self._heading = 0
        self._held = self.hold
        self._decided(home)
        return home

    def _beats(self, level: int, other: int) -> bool:
        return self.figures[level] < self.figures[other] * (1 - self.margin)

    def _move(self, level: int) -> int:
        """Centre the search on `level`; figures around the old home are stale."""
        self._heading = 1 if level > self._home else -1
        self._home = level
        self.figures = {level: self.figures[level]}
        return self._next()

    def _go(self, level: int) -> None:
        if level != self.level:
            self._skip = self.settle
        self.level = level

    def _decided(self, level: int) -> None:
        """One log line when the settled choice changes (offload vs the CPU's share)."""
        if level == self._chosen:
            return
        self._chosen = level
        table = ", ".join(f"{self.scale.value(lv):g}: {t * 1e3:.2f} ms" for lv, t in sorted(self.figures.items()))
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
                                  for lv, t in sorted(self.figures.items())},
            "cpu_quota_windows": self.windows,
            "cpu_quota_start_per_layer": None if self.predicted is None else self.scale.value(self.predicted),
        }
