"""The host-load gauge (moe/host_load.py) against hand-written /proc texts, and auto's use
of it (moe/quota_auto.py): no CPU share tried while other work holds the cores, the
survey as soon as they are free."""

from __future__ import annotations

import logging

import pytest

from edgemoe.moe import host_load
from edgemoe.moe.host_load import HostLoad, Sample, busy_cores_limit, read_sample
from edgemoe.moe.quota_controller import QuotaController
from edgemoe.moe.quota_levels import FRACTION

TOP = FRACTION.max_level(8)
STAT = """cpu  900 0 300 5000 10 0 0 40 0 0
cpu0 100 0 50 1000 5 7 3 10 0 0
cpu1 200 0 50 1000 5 0 0 20 0 0
cpu2 600 0 200 3000 0 0 0 10 0 0
intr 12345
"""
SELF = "4242 (python3 (edgemoe)) R 1 2 3 4 5 6 7 8 9 10 70 30 0 0 20 0 9 0"  # utime, stime: fields 14, 15


def test_a_sample_counts_busy_and_stolen_time_of_the_allowed_cpus_only() -> None:
    s = read_sample(STAT, SELF, {0, 1}, at=2.0)
    # cpu0: user 100 + system 50 + irq 7 + softirq 3 + steal 10; cpu1: 200 + 50 + 20; idle and iowait not
    assert s == Sample(2.0, 170 + 270, 70 + 30)  # own: utime 70 + stime 30 (a name with spaces and parens)
    assert read_sample(STAT, SELF, {0}, at=1.0, parent_stat=SELF).own == 200  # the server process's time is ours
    assert read_sample(STAT, SELF, {0}, at=1.0, parent_stat="").own == 100  # no parent to read
    assert read_sample(STAT, SELF, {7}, at=0.0) is None  # none of the CPUs listed
    assert read_sample("intr 1\n", SELF, {0}, at=0.0) is None
    assert read_sample(STAT, "1 (x) R 1", {0}, at=0.0) is None


def samples(*rows: tuple[float, int, int]):
    """A sampler handing out `rows` (at, busy, own) in turn, then None."""
    it = iter([Sample(*r) for r in rows])
    return lambda: next(it, None)


def test_others_are_busy_ticks_less_our_own_over_intervals_of_at_least_the_span() -> None:
    hz = host_load.os.sysconf("SC_CLK_TCK")
    gauge = HostLoad(span=0.25, sample=samples((0.0, 0, 0), (0.1, 5 * hz, 0), (0.5, 4 * hz // 2 + hz, hz // 2),
                                                 (0.6, 4 * hz, hz), (1.0, 4 * hz, 2 * hz)))
    assert gauge.others() is None  # 0.1 s: shorter than the span, nothing yet
    assert gauge.others() == pytest.approx((3 * hz - hz / 2) / hz / 0.5)  # (busy - own) / interval, in cores
    first = gauge.others()
    assert first == pytest.approx(5.0)  # 0.1 s after: the last whole interval's reading stays
    assert gauge.others() == 0.0  # our own time over the busy time: clamped at no one else
    assert gauge.others() == 0.0  # no /proc: the last reading, and a new start


def test_busy_cores_limit_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert busy_cores_limit() == 2.0
    monkeypatch.setenv("EDGEMOE_AUTO_BUSY_CORES", "2.5")
    assert busy_cores_limit() == 2.5
    monkeypatch.setenv("EDGEMOE_AUTO_BUSY_CORES", "0")
    assert busy_cores_limit() == float("inf")
    for bad in ("many", "-1", "nan"):
        monkeypatch.setenv("EDGEMOE_AUTO_BUSY_CORES", bad)
        with pytest.raises(ValueError, match="EDGEMOE_AUTO_BUSY_CORES"):
            busy_cores_limit()


def drive(ctl: QuotaController, steps: int, share_ms: float = 4.5) -> list[int]:
    """Each step's level: offload's steps take 5 ms, a share's `share_ms`."""
    levels, now = [], 0.0
    for _ in range(steps):
        level = ctl.step(now, 1)
        if ctl.windows >= 1 and ctl.predicted is None:
            ctl.inform(3.0, 4.0, 12.0)
        levels.append(level)
        now += 5e-3 if level == 0 else share_ms * 1e-3
    return levels


def auto(reading: list[float | None]) -> QuotaController:
    return QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto", host_load=lambda: reading[0],
                           busy_cores=1.0)


def test_auto_tries_no_share_while_other_work_holds_the_cores(caplog: pytest.LogCaptureFixture) -> None:
    reading: list[float | None] = [4.0]
    ctl = auto(reading)
    with caplog.at_level(logging.INFO, logger="edgemoe.moe.quota_auto"):
        assert set(drive(ctl, 200)) == {0}  # 20+ windows at offload, never a share
        busy_lines = [r for r in caplog.records if "other work keeps 4.0" in r.getMessage()]
        assert len(busy_lines) == 1 and busy_lines[0].levelno == logging.WARNING  # said once, where a user sees it
        reading[0] = 0.2
        levels = drive(ctl, 40)
        assert levels[0] == 0 and set(levels) != {0}, levels  # the survey, at the first window once free
        assert any("free again" in r.getMessage() for r in caplog.records)


def test_a_later_survey_looks_again_and_says_it_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A survey cut short (shares far slower) starts again later: the host is read again
    then, and a second busy spell is logged at INFO (the warning was the first's)."""
    reading: list[float | None] = [4.0]
    ctl = auto(reading)
    with caplog.at_level(logging.INFO, logger="edgemoe.moe.quota_auto"):
        drive(ctl, 40)
        reading[0] = 0.2
        assert set(drive(ctl, 40, share_ms=30.0)) != {0}  # surveyed, cut short
        reading[0] = 3.0
        assert set(drive(ctl, 400, share_ms=30.0)) == {0}  # the retries find the host busy again
    again = [r.levelno for r in caplog.records if "other work keeps 3.0" in r.getMessage()]
    assert again == [logging.INFO]


def test_an_unknown_load_or_no_gauge_does_not_stop_the_survey() -> None:
    for gauge in (None, lambda: None):
        ctl = QuotaController(max_level=TOP, start=0, scale=FRACTION, label="auto", host_load=gauge, busy_cores=1.0)
        assert set(drive(ctl, 40)) != {0}


def test_hybrid_and_engines_without_auto_take_no_gauge() -> None:
    assert QuotaController.live(max_level=TOP, start=8, scale=FRACTION, label="hybrid").host_load is None
    assert QuotaController.live(max_level=TOP, start=0, scale=FRACTION, label="auto").host_load is not None


def test_the_gauge_reads_this_machine() -> None:
    """On Linux a reading after one span: a number of cores within this process's CPUs."""
    if host_load._proc_sample() is None:
        pytest.skip("no /proc/stat here")
    gauge = HostLoad(span=0.05)
    deadline = host_load.time.monotonic() + 0.2
    while host_load.time.monotonic() < deadline:
        pass  # busy: our own time, which the reading leaves out
    others = gauge.others()
    assert others is not None and 0.0 <= others <= len(host_load._allowed_cpus())
