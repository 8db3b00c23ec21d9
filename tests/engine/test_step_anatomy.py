"""The overlapped step's anatomy (`engine/step_anatomy.py`): phases from the loop's clock
marks, the collector's pauses charged to the step they ran in, and a benchmark's slow
steps picked against its own timing."""

from __future__ import annotations

import gc

import pytest

from edgemoe.engine.step_anatomy import StepAnatomy, phase_totals, slow_steps


def test_phases_come_from_the_marks_and_collections_go_to_their_step() -> None:
    anatomy = StepAnatomy()
    anatomy.start()
    try:
        anatomy.record(0, 1_000, 5_000, 12_000)
        gc.collect()  # a full collection between the first and second record: the second's
        anatomy.record(12_000, 13_000, 14_000, 15_000)
        anatomy.record(15_000, 15_500, 16_000, 17_000)
    finally:
        anatomy.stop()
    first, second, third = anatomy.steps
    assert first.phases_ns == (1_000, 4_000, 7_000) and first.gc_generations == ()
    assert second.gc_ns > 0 and 2 in second.gc_generations
    assert third.gc_ns == 0 and third.gc_generations == ()
    assert anatomy._on_gc not in gc.callbacks  # stop() unhooks the collector
    totals = phase_totals(anatomy)
    assert totals["launch_ms"] == pytest.approx((4_000 + 1_000 + 500) / 1e6, abs=0.01)
    assert totals["gc_collections"].get("2", 0) >= 1


def test_slow_steps_are_those_over_the_factor_slowest_first() -> None:
    anatomy = StepAnatomy()
    times = [0.005, 0.005, 0.040, 0.005, 0.053, 0.006, 0.005]
    for i, t in enumerate(times):  # launch takes the step's time, less 1 µs of schedule and complete
        ns = round(t * 1e9)
        anatomy.record(0, 1_000, ns - 1_000, ns)
    got = slow_steps(times, anatomy, factor=2.0)
    assert [s["step"] for s in got] == [4, 2]
    assert got[0]["ms"] == 53.0 and got[0]["launch_ms"] == pytest.approx(53.0, abs=0.01)
    assert slow_steps(times + [0.1], anatomy) == []  # more steps timed than recorded: no guess
    assert slow_steps([], anatomy) == []


def test_the_record_keeps_the_latest_steps() -> None:
    anatomy = StepAnatomy(capacity=3)
    for i in range(5):
        anatomy.record(0, i, i, i)
    assert [r.phases_ns[0] for r in anatomy.steps] == [2, 3, 4]


class FakeEvent:
    """A CUDA timing event's interface on a fixed clock (ms)."""

    def __init__(self, at_ms: float) -> None:
        self.at_ms = at_ms
        self.synced = False

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, later: "FakeEvent") -> float:
        return later.at_ms - self.at_ms


def test_device_spans_tell_a_slow_device_from_a_late_host() -> None:
    """The step completed in a slow iteration is the one launched an iteration before: its
    span says whether the device took the time (a wait inside it) or the host saw it late."""
    anatomy = StepAnatomy()
    spans = [(0.0, 4.0), (4.0, 72.0), (72.0, 76.5), (80.0, 84.0)]  # step 1's device work took 68 ms
    times = [0.005, 0.005, 0.070, 0.005]
    for (a, b), t in zip(spans, times, strict=True):
        ns = round(t * 1e9)
        anatomy.record(0, 1_000, 2_000, ns, (FakeEvent(a), FakeEvent(b)))
    (slow,) = slow_steps(times, anatomy)
    assert slow["step"] == 2
    assert slow["completed"] == {"device_ms": 68.0, "device_gap_ms": 0.0}
    assert slow["launched"] == {"device_ms": 4.5, "device_gap_ms": 0.0}
    assert isinstance(slow["switches"], int) and slow["switches"] >= 0
    totals = phase_totals(anatomy)
    assert totals["device_ms"] == pytest.approx(4.0 + 68.0 + 4.5 + 4.0)
    assert totals["device_gap_ms"] == pytest.approx(3.5)  # the device idle before the last step


def test_without_events_no_device_figures() -> None:
    anatomy = StepAnatomy()
    assert anatomy.device_event() is None  # device timing off: no CUDA touched
    for _ in range(3):
        anatomy.record(0, 1_000, 2_000, 3_000, (None, None))
    assert all(r.events is None for r in anatomy.steps)
    assert "device_ms" not in phase_totals(anatomy)
    slow = slow_steps([0.001, 0.001, 0.01], anatomy)
    assert slow and "completed" not in slow[0] and "launched" not in slow[0]


def test_involuntary_switches_are_charged_to_their_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgemoe.engine.step_anatomy as mod

    counts = iter([10, 10, 13, 13])  # start(), then one reading a record
    monkeypatch.setattr(mod, "_thread_switches", lambda: next(counts))
    anatomy = StepAnatomy()
    anatomy.start()
    try:
        anatomy.record(0, 1, 2, 3)
        anatomy.record(3, 4, 5, 6)
        anatomy.record(6, 7, 8, 9)
    finally:
        anatomy.stop()
    assert [r.switches for r in anatomy.steps] == [0, 3, 0]
    assert phase_totals(anatomy)["switches"] == 3


def test_the_cpu_shares_calls_are_charged_to_their_step() -> None:
    """With a reader of the CPU share's cumulative (calls, ns), each record carries what
    the CPU did since the last: a slow step whose CPU was slow says so."""
    totals = iter([(4, 1_000_000), (4, 1_000_000), (52, 30_000_000), (100, 31_000_000)])  # start(), then a record each
    anatomy = StepAnatomy(cpu=lambda: next(totals))
    anatomy.start()
    for t0 in (0, 5_000_000, 40_000_000):
        anatomy.record(t0, t0 + 1_000, t0 + 2_000, t0 + (35_000_000 if t0 == 5_000_000 else 5_000_000))
    assert [r.cpu for r in anatomy.steps] == [(0, 0), (48, 29_000_000), (48, 1_000_000)]
    (slow,) = slow_steps([0.005, 0.035, 0.005], anatomy)
    assert slow["step"] == 1 and slow["cpu_calls"] == 48 and slow["cpu_ms"] == 29.0
    assert phase_totals(anatomy)["cpu_ms"] == 30.0
    plain = StepAnatomy()  # no reader: no CPU figures
    plain.record(0, 1, 2, 3)
    assert plain.steps[0].cpu is None and "cpu_ms" not in phase_totals(plain)
