"""auto's choice between offload and a CPU share (moe/quota_controller.py), against a
simulated host whose decode step behaves as the GPU machine's did (2026-12-05): the step
time is not convex in the level (a small share costs its fixed overheads without gain),
each step varies by a few %, and after a switch the cache still holds what the previous
level admitted, so a larger share looks faster for a while than it will be. Over a
benchmark's 320 decode steps, exploration included, auto must decode within 5% of the best
fixed level's time (each fixed level simulated on the same host and noise)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from edgemoe.moe.quota_controller import QuotaController
from edgemoe.moe.quota_levels import FRACTION

STEPS = 320
TOP = FRACTION.max_level(8)  # 16 sixteenths

# Steady step times (ms) by level 0..16 (sixteenths of each layer's misses on the CPU), after
# the GPU machine's readings: int4 offload 4.70, auto held at 13/16 ~5.0 (p50 4.96); fp8
# offload 9.08, 2/16 9.36, hybrid settled near 8/16 at ~7.9; bf16's share best far up (hybrid
# settled at 13/16). The levels between are interpolated.
INT4 = [4.70] + [4.70 * r for r in (1.10, 1.10, 1.09, 1.08, 1.07, 1.065, 1.06, 1.06, 1.06, 1.06,
                                    1.065, 1.07, 1.08, 1.09, 1.10, 1.12)]  # offload best, shares 6-12% slower
FP8 = [9.08, 9.30, 9.36, 9.30, 9.10, 8.75, 8.40, 8.10, 7.90, 7.90, 7.95, 8.10, 8.30, 8.55, 8.80, 9.10, 9.50]
BF16 = [17.0, 17.4, 17.3, 17.0, 16.6, 16.2, 15.8, 15.4, 15.1, 14.8, 14.6, 14.5, 14.4, 14.4, 14.6, 14.9, 15.5]


@dataclass
class Host:
    """A decode step's time at a level: the steady curve, the cache's lag behind a switch
    (`lag` steps; a step `gain` faster per whole range the cache's level lies below the
    step's: offload admitted what a share would compute), a fresh engine's first steps
    slower, a slow drift and per-step noise (`noise` relative, and a rare stall). With
    these defaults a window of 13/16 right after offload (one step skipped, as the
    controller did until 2026-12-05) reads ~12% under its steady time, as the GPU machine's did (4.30 ms
    against ~5)."""

    curve: list[float]
    seed: int
    noise: float = 0.03
    lag: float = 12.0
    gain: float = 0.25
    warmup: int = 6
    cold_s: float = 0.0  # the CPU share's cold start: its steps for this long after its first run `cold` x slower
    cold: float = 6.0
    rng: random.Random = field(init=False)
    now: float = field(init=False, default=0.0)
    first_share: float | None = field(init=False, default=None)
    cache: float = field(init=False, default=0.0)  # the level the cache's content is shaped by
    steps: int = field(init=False, default=0)
    phase: float = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.phase = self.rng.uniform(0, 2 * math.pi)

    def period(self, level: int) -> float:
        t, self.steps = self.steps, self.steps + 1
        transient = 1 - self.gain * (level - self.cache) / TOP
        self.cache += (level - self.cache) / self.lag
        warm = 1 + 0.15 * max(self.warmup - t, 0) / self.warmup
        drift = 1 + 0.02 * math.sin(self.phase + 2 * math.pi * t / 160)
        jitter = 1 + self.rng.gauss(0, self.noise) + (0.3 if self.rng.random() < 0.02 else 0.0)
        if level and self.first_share is None:
            self.first_share = self.now
        cold = self.cold if level and self.now - (self.first_share or 0.0) < self.cold_s else 1.0
        period = self.curve[level] * 1e-3 * transient * warm * drift * jitter * cold
        self.now += period
        return period


def run_fixed(curve: list[float], level: int, seed: int) -> float:
    host = Host(curve, seed)
    return statistics.fmean(host.period(level) for _ in range(STEPS))


@dataclass
class Run:
    mean: float  # the mean step time (s)
    settled_at: int | None  # the step of the first settled choice
    settled: int | None  # its level
    final: int | None  # the last settled choice's level


def run_controller(ctl: QuotaController, curve: list[float], seed: int, predicted: int, cold_s: float = 0.0) -> Run:
    """Drive `STEPS` decode steps as the executor does: the controller's level for each step,
    `inform` (with rates that put the balance at `predicted`) once its first window is in."""
    host, now, periods, first = Host(curve, seed, cold_s=cold_s), 0.0, [], None
    for step in range(STEPS):
        ctl.step(now, 1)
        if ctl.windows >= 1 and ctl.predicted is None:
            ctl.inform(3.0, float(predicted), float(TOP - predicted))  # link : cpu = predicted : the rest
        period = host.period(ctl.level)
        periods.append(period)
        now += period
        settled = ctl.snapshot()["cpu_quota_settled"]
        if first is None and settled is not None:
            first = (step, round(settled * ctl.scale.per_unit))
    last = ctl.snapshot()["cpu_quota_settled"]
    final = None if last is None else round(last * ctl.scale.per_unit)
    return Run(statistics.fmean(periods), *(first or (None, None)), final)


def best_fixed(curve: list[float], seed: int, levels: range) -> float:
    return min(run_fixed(curve, level, seed) for level in levels)


SCENARIOS = {  # curve, the informed start's prediction
    "int4, a share predicted": (INT4, 11),
    "int4, a large share predicted": (INT4, 13),
    "fp8, a small share predicted": (FP8, 2),
    "fp8, the best share predicted": (FP8, 9),
    "bf16, a far share best": (BF16, 8),
}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_auto_is_within_5_percent_of_the_best_fixed_level(scenario: str, seed: int) -> None:
    curve, predicted = SCENARIOS[scenario]
    auto = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto")
    run = run_controller(auto, curve, seed, predicted)
    best = best_fixed(curve, seed, range(TOP + 1))
    assert run.mean <= best * 1.05, f"auto {run.mean * 1e3:.3f} ms, the best fixed {best * 1e3:.3f} ({auto.history})"
    # Its first verdict comes within the benchmark's first 200 steps, and is itself right.
    assert run.settled_at is not None and run.settled_at < 200 and run.settled is not None
    assert curve[run.settled] <= min(curve) * 1.05


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scenario", ["int4, a share predicted", "int4, a large share predicted",
                                      "fp8, the best share predicted"])
def test_a_cold_cpu_share_costs_auto_its_first_steps_only(scenario: str, seed: int) -> None:
    """The CPU share's first steps on the GPU machine sometimes ran 4-12x slow, for 3-16 steps
    (2026-12-05, 4 int4 runs in 10): here 6x for 0.15 s from the share's first step. auto
    cuts the visit after `CUT_AFTER` such steps and surveys again after offload's next window
    (then 8x as many after each cut), so the cold start costs it about those steps
    (0.01-0.21 ms a step over 320, against 0.42-0.46 when every visit ran its settle and
    window), and it still settles right."""
    curve, predicted = SCENARIOS[scenario]
    warm = run_controller(QuotaController(max_level=TOP, start=0, scale=FRACTION), curve, seed, predicted)
    auto = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto")
    cold = run_controller(auto, curve, seed, predicted, cold_s=0.15)
    cost = cold.mean - warm.mean
    assert cost < 0.34e-3, f"the cold start cost {cost * 1e3:.3f} ms a step ({auto.history})"
    # a cut says offload for now; the choice it ends on is right
    assert cold.final is not None and curve[cold.final] <= min(curve) * 1.05


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scenario", ["fp8, a small share predicted", "bf16, a far share best"])
def test_hybrid_is_within_5_percent_of_the_best_share(scenario: str, seed: int) -> None:
    curve, predicted = SCENARIOS[scenario]
    hybrid = QuotaController(max_level=TOP, start=FRACTION.hybrid_start(), scale=FRACTION, label="hybrid")
    run = run_controller(hybrid, curve, seed, predicted)
    best = best_fixed(curve, seed, range(1, TOP + 1))
    assert run.mean <= best * 1.05, f"hybrid {run.mean * 1e3:.3f} ms, the best share {best * 1e3:.3f}"


@pytest.mark.parametrize("curve,choice", [(INT4, "offload"), (FP8, "share")])
def test_the_choice_stays_right_over_long_runs(curve: list[float], choice: str) -> None:
    """Re-checks after each hold, a confirmation against offload among them, don't flap:
    from step 400 to 3,000 the settled choice is always the right kind, and a share stays
    within 6/16..11/16 (steps within 6% of the best, 8/16–9/16)."""
    for seed in range(3):
        ctl = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto")
        host, now, settled = Host(curve, seed), 0.0, []
        for _ in range(3000):
            ctl.step(now, 1)
            if ctl.windows >= 1 and ctl.predicted is None:
                ctl.inform(3.0, 8.0, 8.0)
            now += host.period(ctl.level)
            settled.append(ctl.snapshot()["cpu_quota_settled"])
        late = [s for s in settled[400:] if s is not None]
        assert late, "never settled"
        if choice == "offload":
            assert all(s == 0 for s in late), f"seed {seed}: left offload ({sorted(set(late))})"
        else:
            assert all(abs(s * TOP - 8.5) <= 2.5 for s in late), f"seed {seed}: off the best ({sorted(set(late))})"


def stolen(curve: list[float]) -> list[float]:
    """A host losing CPU time to its hypervisor (an H100, 2026-12-05 15:50: 1.6-2.8% of the
    CPU time stolen while the share ran): a share's steps slower the larger it is, half the
    misses ~2.1x offload's step, 3/16 ~1.05x its healthy time, 2/16 unchanged."""
    return [c * (1 + 1.1 * max(0.0, (lv - 2) / 6) ** 2) if lv else c for lv, c in enumerate(curve)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scenario", ["int4, a share predicted", "fp8, the best share predicted"])
def test_a_host_losing_cpu_time_costs_auto_a_few_steps(scenario: str, seed: int) -> None:
    """On such a host offload wins throughout: auto cuts the survey's first visit, surveys
    again after one window of offload and then after 8, 64: a few slow steps in 320 (2% over
    offload), where surveying again after every window ran 4.5-18% over."""
    curve, predicted = SCENARIOS[scenario]
    curve = stolen(curve)
    auto = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto")
    run = run_controller(auto, curve, seed, predicted)
    best = best_fixed(curve, seed, range(TOP + 1))
    assert run.mean <= best * 1.03, f"auto {run.mean * 1e3:.3f} ms, offload {best * 1e3:.3f} ({auto.history})"
    assert run.settled == 0 and run.final == 0


def test_the_survey_ends_once_offload_beats_every_share_it_visits() -> None:
    """Offload's windows at 4.7 ms, each share's at 5.6 (a margin of ~2%): after one visit to
    each of the survey's two shares the confirmation starts (offload), not the survey's
    second round."""
    ctl = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto")
    now, levels = 0.0, []
    for _ in range(120):
        ctl.step(now, 1)
        if ctl.windows >= 1 and ctl.predicted is None:
            ctl.inform(3.0, 4.0, 12.0)  # the balance at 4/16
        levels.append(ctl.level)
        now += 4.7e-3 if ctl.level == 0 else 5.6e-3
    visits = [lv for i, lv in enumerate(levels) if i == 0 or lv != levels[i - 1]]
    assert visits[:4] == [0, 8, 4, 0], visits
    assert ctl.snapshot()["cpu_quota_settled"] == 0


def test_one_period_far_slower_than_offload_ends_the_visit() -> None:
    """Past `CUT_NOW` x offload's window one period is enough (a busy host's share starts ran
    4-8x offload's steps, 2026-12-05 16:26: each one sat through cost a step of ~25 ms)."""
    ctl = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto")
    now, levels = 0.0, []
    for _ in range(40):
        level = ctl.step(now, 1)
        if ctl.windows >= 1 and ctl.predicted is None:
            ctl.inform(3.0, 4.0, 12.0)
        levels.append(level)
        now += 5e-3 if level == 0 else (25e-3 if levels.count(level) == 1 else 5.5e-3)
    first = levels.index(8)
    assert levels[first + 1] == 0, levels  # its first period, 5x offload's, ended it


@pytest.mark.parametrize("raw,want", [("2", 2.0), ("0", math.inf), ("-1", None), ("nan", None), ("x", None)])
def test_the_cut_factor_from_the_environment(raw: str, want: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """-1 cut every visit and nan none, silently; "x" was refused already."""
    from edgemoe.moe.quota_auto import _cut

    monkeypatch.setenv("EDGEMOE_AUTO_CUT", raw)
    if want is None:
        with pytest.raises(ValueError, match="EDGEMOE_AUTO_CUT"):
            _cut()
    else:
        assert _cut() == want
