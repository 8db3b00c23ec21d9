"""The CPU share's live quota (moe/quota_controller.py), driven by simulated decode steps
whose period is a function of the level: it settles on the fastest level, stays at 0
when the CPU only slows steps, follows a change after its hold, ignores prompt steps and
batch-size changes, and costs little while exploring."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import pytest

from edgemoe.moe.quota_controller import QuotaController
from edgemoe.moe.quota_levels import QUARTERS, quota_rows


def run(ctl: QuotaController, cost: Callable[[int], float], steps: int, noise: float = 0.0,
        seed: int = 0) -> list[float]:
    """Drive `steps` batch-1 decode steps; each lasts cost(level) (× 1 ± noise). Returns the periods."""
    rng, now, periods = random.Random(seed), 0.0, []
    for _ in range(steps):
        level = ctl.step(now, 1)
        period = cost(level) * (1 + rng.uniform(-noise, noise))
        periods.append(period)
        now += period
    return periods


def bowl(best: int, base: float = 0.020, slope: float = 0.0015) -> Callable[[int], float]:
    return lambda level: base + slope * abs(level - best)


@pytest.mark.parametrize("best,start", [(6, 0), (0, 4), (12, 4), (3, 8)])
def test_settles_on_the_fastest_level(best: int, start: int) -> None:
    ctl = QuotaController(max_level=4 * 8, start=start, stride=1)
    run(ctl, bowl(best), 600, noise=0.005)
    assert ctl.snapshot()["cpu_quota_settled"] == best / QUARTERS
    assert abs(ctl.level - best) <= ctl.stride  # at it, or exploring a neighbour after a hold


def test_stays_offload_when_the_cpu_only_slows_steps() -> None:
    ctl = QuotaController(max_level=32, start=0)
    periods = run(ctl, lambda level: 0.020 * (1 + 0.1 * level), 2000, noise=0.01)
    assert ctl.snapshot()["cpu_quota_settled"] == 0 and ctl.level in (0, 2)
    # Exploring a neighbour for one window in every hold + 1 costs under 2% on average.
    assert sum(periods[400:]) / len(periods[400:]) < 0.020 * 1.02


def test_follows_a_change_after_its_hold() -> None:
    ctl = QuotaController(max_level=32, start=0, stride=2, hold=4)
    run(ctl, bowl(8), 800)
    assert ctl.snapshot()["cpu_quota_settled"] == 2.0
    run(ctl, bowl(0), 800)  # the cores got busy: the CPU's share now only hurts
    assert ctl.snapshot()["cpu_quota_settled"] == 0


def test_noise_within_the_margin_never_moves_it_off_a_flat_optimum() -> None:
    ctl = QuotaController(max_level=32, start=4, margin=0.02)
    run(ctl, lambda level: 0.020, 1500, noise=0.005)  # all equal: every move needs a 2% gain
    assert ctl.snapshot()["cpu_quota_settled"] == 1.0


def test_prompt_steps_and_new_batch_sizes_give_no_period() -> None:
    ctl = QuotaController(max_level=8, window=2, settle=0)
    for t, batch in ((0.0, 1), (1.0, None), (2.0, 1), (3.0, 2), (4.0, 1)):
        ctl.step(t, batch)
    assert ctl.windows == 0 and not ctl._periods  # each pair had a prompt step or a size change between
    ctl.step(4.5, 1)
    ctl.step(5.0, 1)
    assert ctl.windows == 1 and ctl.history[-1] == (0, 0.5)


def test_the_settled_choice_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    ctl = QuotaController(max_level=16, start=0, label="auto")
    with caplog.at_level(logging.WARNING):
        run(ctl, bowl(8), 1500)
    lines = [r.getMessage() for r in caplog.records if "moe auto" in r.getMessage()]
    assert len(lines) == 1 and "2 misses a layer" in lines[0]


def test_quota_rows_average_the_level() -> None:
    for level in range(0, 33):
        rows = quota_rows(level, 48)
        assert sum(rows) == level * 48 // QUARTERS
        assert max(rows) - min(rows) <= 1
    assert quota_rows(0, 5) == [0] * 5


def test_rejects_bad_levels() -> None:
    with pytest.raises(ValueError):
        QuotaController(max_level=4, start=5)


def windows_to_settle(ctl: QuotaController, cost: Callable[[int], float]) -> int:
    """Windows until the first settled choice (a hold)."""
    now = 0.0
    while ctl.snapshot()["cpu_quota_settled"] is None:
        now += cost(ctl.step(now, 1))
        assert ctl.windows < 200, "never settled"
    return ctl.windows


@pytest.mark.parametrize("best,start", [(20, 4), (4, 24)])
def test_a_far_optimum_costs_a_window_a_stride(best: int, start: int) -> None:
    """Going on in the direction of the last move measures one level a stride: from a
    start 8 strides away it settles in 12 windows (19 before)."""
    ctl = QuotaController(max_level=40, start=start, stride=2)
    strides = abs(best - start) // ctl.stride
    assert windows_to_settle(ctl, bowl(best)) <= strides + 4  # the start, its far side, the last two
    assert ctl.level == best and ctl.snapshot()["cpu_quota_settled"] == best / QUARTERS


def test_a_shallow_slope_is_followed_two_strides_at_a_time() -> None:
    """A stride gains 1.2% (under the 2% margin), two strides 2.4%: it still gets to the
    best (Qwen3.8 held at 3 experts a layer where 6.5 was 20% faster)."""
    ctl = QuotaController(max_level=40, start=4, stride=2)
    run(ctl, bowl(20, slope=0.00012), 400)
    settled = ctl.snapshot()["cpu_quota_settled"]
    assert settled is not None and abs(settled * QUARTERS - 20) <= ctl.stride


def test_the_snapshot_keeps_each_windows_level_and_median() -> None:
    """The statistics carry the search's history (each window's level, in the scale's unit,
    and its median period in ms), oldest first: how a run's choice came about."""
    ctl = QuotaController(max_level=32, start=4)
    run(ctl, bowl(6), 200)
    history = ctl.snapshot()["cpu_quota_history"]
    assert len(history) == ctl.windows and history[0][0] == 4 / QUARTERS
    assert history == [[lv / QUARTERS, round(t * 1e3, 3)] for lv, t in ctl.history]
    assert min(ms for _, ms in history) == pytest.approx(20.0)  # the bowl's floor, at its best level
