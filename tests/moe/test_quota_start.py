"""The live quota's informed start (moe/quota_controller.py `inform`, gathered by the
device cache's executor): after the first window the controller measures the level where
the CPU and the link balance, centres the search there when it wins, and climbs from
wherever it lands; auto never settles above offload on a wrong prediction."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.kernels.share_state import FRACTION_ONE
from edgemoe.moe.quota_controller import QuotaController
from edgemoe.moe.quota_levels import COUNT, FRACTION, QUARTERS, balance_level, share_scale
from edgemoe.moe.registry import make_executor
from edgemoe.testing.moe_material import random_bank_store

MS = 1e-3


def bowl(best: int, base: float = 0.020, slope: float = 0.0015) -> Callable[[int], float]:
    return lambda level: base + slope * abs(level - best)


def drive(ctl: QuotaController, cost: Callable[[int], float], until: Callable[[], bool], limit: int = 3000) -> None:
    """Batch-1 decode steps lasting cost(level) until `until()`."""
    now, steps = 0.0, 0
    while not until():
        now += cost(ctl.step(now, 1))
        steps += 1
        assert steps < limit, "never got there"


def settle(ctl: QuotaController, cost: Callable[[int], float], prediction: tuple[float, float, float]) -> int:
    """Windows to the first settled choice, told `prediction` (m, t_link, t_cpu) after the first window."""
    drive(ctl, cost, lambda: ctl.windows >= 1)
    ctl.inform(*prediction)
    drive(ctl, cost, lambda: ctl.snapshot()["cpu_quota_settled"] is not None)
    return ctl.windows


@pytest.mark.parametrize("misses,link_ms,cpu_ms,level", [
    (9.0, 0.3, 0.2, 22),  # q* = 9 x 0.6 = 5.4 experts a layer: 21.6 quarters
    (9.0, 0.3, 0.3, 18),  # equal rates: half the misses
    (0.0, 0.3, 0.2, 0),  # nothing missed: nothing to share
    (9.0, 0.3, 0.0, 32),  # a free CPU takes every miss, clamped to max_level (8 a layer)
    (9.0, 0.0, 0.2, 0),  # a free link: offload
    (9.0, 0.0, 0.0, 0),  # no rates at all
])
def test_the_balance_level(misses: float, link_ms: float, cpu_ms: float, level: int) -> None:
    assert balance_level(misses, link_ms * MS, cpu_ms * MS, max_level=32) == level


@pytest.mark.parametrize("misses,link_ms,cpu_ms,level", [
    (9.0, 0.3, 0.2, 10),  # 0.6 of each layer's misses: 9.6 sixteenths
    (2.0, 0.3, 0.3, 8),  # equal rates: half, whatever m
    (0.0, 0.3, 0.2, 0),  # nothing missed: nothing to share
    (9.0, 0.3, 0.0, 16),  # a free CPU takes every miss
    (9.0, 0.0, 0.2, 0),  # a free link: offload
])
def test_the_balance_level_as_a_fraction_of_each_layers_misses(misses: float, link_ms: float, cpu_ms: float,
                                                               level: int) -> None:
    assert balance_level(misses, link_ms * MS, cpu_ms * MS, max_level=16, scale=FRACTION) == level
    assert FRACTION.per_unit == FRACTION_ONE  # the kernels' sixteenths


def test_the_share_split_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert share_scale() is FRACTION  # the default
    monkeypatch.setenv("EDGEMOE_SHARE_SPLIT", "count")
    assert share_scale() is COUNT
    monkeypatch.setenv("EDGEMOE_SHARE_SPLIT", "half")
    with pytest.raises(ValueError, match="EDGEMOE_SHARE_SPLIT must be one of count, fraction"):
        share_scale()


def test_it_lands_on_the_prediction_once_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    ctl = QuotaController(max_level=32, start=QUARTERS)
    drive(ctl, bowl(20), lambda: ctl.windows >= 1)
    assert ctl.snapshot()["cpu_quota_start_per_layer"] is None
    with caplog.at_level(logging.INFO, logger="edgemoe.moe.quota_controller"):
        assert ctl.inform(9.0, 0.3 * MS, 0.2 * MS) == 22
        assert ctl.inform(2.0, 0.3 * MS, 0.2 * MS) == 22  # once: a second call changes nothing
    assert ctl.level == ctl.predicted == 22 and ctl.snapshot()["cpu_quota_start_per_layer"] == 5.5
    lines = [r.getMessage() for r in caplog.records if "balance" in r.getMessage()]
    assert len(lines) == 1 and "5.5 misses a layer (level 22)" in lines[0]
    assert all(s in lines[0] for s in ("9.00 misses", "0.300 ms a copy", "0.200 ms a CPU expert"))


def test_a_good_prediction_saves_the_climb() -> None:
    """From one expert a layer to a best at 5: the climb alone costs a window a stride;
    told 5.5, it settles in a handful."""
    plain = QuotaController(max_level=40, start=QUARTERS)
    drive(plain, bowl(20), lambda: plain.snapshot()["cpu_quota_settled"] is not None)
    informed = QuotaController(max_level=40, start=QUARTERS)
    told = settle(informed, bowl(20), (9.0, 0.3 * MS, 0.2 * MS))  # level 22
    assert informed.level == 20 and informed.snapshot()["cpu_quota_settled"] == 5.0
    assert plain.level == 20 and told <= 6 < plain.windows


@pytest.mark.parametrize("best,prediction", [(8, 36), (36, 12)])
def test_a_wrong_prediction_is_corrected_by_the_climb(best: int, prediction: int) -> None:
    ctl = QuotaController(max_level=40, start=QUARTERS)
    settle(ctl, bowl(best), (prediction / QUARTERS, 1.0, 0.0))  # a free CPU: m itself
    assert ctl.predicted == prediction and ctl.snapshot()["cpu_quota_settled"] == best / QUARTERS


def test_auto_surveys_half_and_the_prediction_then_confirms_against_offload() -> None:
    """auto starts at offload, then surveys hybrid's start (one expert a layer by count)
    and the prediction: where the shares only slow steps it goes back to offload; where
    one wins the climb goes on from it, and the share it settles on beat offload again."""
    slower = QuotaController(max_level=32, start=0, label="auto")
    settle(slower, lambda level: 0.020 * (1 + 0.02 * level), (5.0, 1.0, 0.0))  # level 20: 1.4x offload
    levels = [lv for lv, _ in slower.history]
    # each share visited once: offload beat both by twice the margin, so no second round
    assert levels[:4] == [0, QUARTERS, 20, 0] and slower.snapshot()["cpu_quota_settled"] == 0 and slower.level == 0
    # Past 1.5x offload's step (`CUT`), the prediction's visit is cut short after two steps:
    # offload for now, and the survey begins again after offload's next window.
    much = QuotaController(max_level=32, start=0, label="auto")
    settle(much, lambda level: 0.020 * (1 + 0.1 * level), (5.0, 1.0, 0.0))  # level 20: 3x offload
    assert much.snapshot()["cpu_quota_settled"] == 0 and much.level == 0
    drive(much, lambda level: 0.020 * (1 + 0.1 * level), lambda: much.windows >= 40)
    levels = [lv for lv, _ in much.history]
    assert levels[:4] == [0, QUARTERS, 0, QUARTERS]  # surveyed again after one window
    assert 20 not in levels  # cut each time: never a window of its slow steps
    assert much.level == 0 and much.snapshot()["cpu_quota_settled"] == 0
    faster = QuotaController(max_level=32, start=0, label="auto")
    settle(faster, bowl(18), (5.0, 1.0, 0.0))
    levels = [lv for lv, _ in faster.history]
    assert levels[:3] == [0, QUARTERS, 20] and faster.snapshot()["cpu_quota_settled"] == 4.5
    assert levels[-1] == 0 and faster.level == 18  # offload measured again, last, before the share was held


def test_a_prediction_during_a_hold_is_still_measured() -> None:
    ctl = QuotaController(max_level=32, start=0, hold=50)
    drive(ctl, bowl(0), lambda: ctl.snapshot()["cpu_quota_settled"] is not None)  # holding at offload
    assert ctl.inform(3.0, 1.0, 0.0) == 12
    drive(ctl, bowl(0), lambda: ctl.history[-1][0] == 12)
    assert ctl.level == 0 and ctl.snapshot()["cpu_quota_settled"] == 0


L, E, K, H, I = 3, 8, 2, 32, 24


def test_the_executor_gathers_a_decode_sample_and_informs_once() -> None:
    """Through `before_step`: the misses of the decode steps since the last prompt step
    (the CPU's included), a copy at the share's device rate, a CPU expert at its fitted
    rate at one token; the controller told once, its level in the quota tensor."""
    probe = CpuExperts(threads=1)
    native = probe.native
    probe.close()
    if not native:
        pytest.skip("no compiled CPU expert kernel (no C compiler)")
    ex = make_executor("hybrid", random_bank_store(L, E, H, I, torch.bfloat16), torch.device("cpu"), F.silu, L, 4,
                       top_k=K, expert_cache="device")
    assert isinstance(ex, DeviceOffloadExecutor) and ex.controller is not None
    told: list[tuple[int, tuple[float, float, float]]] = []
    inform = ex.controller.inform
    ex.controller.inform = lambda *args: told.append((step, args)) or inform(*args)  # type: ignore[method-assign]
    g, totals = torch.Generator().manual_seed(0), []
    for step in range(16):
        ex.before_step(0.01 * step, None if step == 3 else 1)  # a prompt step: the sample starts after it
        x = torch.randn(1, H, generator=g).to(torch.bfloat16)
        ids = torch.randperm(E, generator=g)[:K].view(1, K).int()
        for layer in range(L):
            ex.forward(layer, x, ids, torch.full((1, K), 0.5))
        totals.append(ex.stats.snapshot()["misses"])  # the executor's own drain: every miss, the CPU's included
    assert len(told) == 1 and told[0][1][0] > 0
    at, (m, link_s, cpu_s) = told[0]
    steps = at - 4  # decode steps 4 .. at-1
    assert steps >= ex.controller.window and m == pytest.approx((totals[at - 1] - totals[3]) / (L * steps))
    fixed, per_pair, device = ex.cpu_share.rate_ns[:3]
    assert link_s == pytest.approx(device * 1e-9) and cpu_s == pytest.approx((fixed + per_pair) * 1e-9)
    scale, level = ex.controller.scale, ex.controller.level
    assert ex.cpu_share.quota.tolist() == scale.rows(level, L, E) and int(ex.cpu_share.fraction) == scale.fraction(level)
    assert ex.stats.snapshot()["cpu_quota_start_per_layer"] == scale.value(ex.controller.predicted)
    ex.close()
