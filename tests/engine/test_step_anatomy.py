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
