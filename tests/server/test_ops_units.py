"""Units of the operations plumbing, each against a brute-force reference: sliding
windows, the admission gate, the request log, and the tracker's bookkeeping under
random request lifecycles."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemoe.messages import AddRequest, RequestOutput, SamplingParams
from edgemoe.server.admission import AdmissionGate
from edgemoe.server.errors import Overloaded
from edgemoe.server.metrics import ServerMetrics
from edgemoe.server.request_log import RequestLog, RequestRecord
from edgemoe.server.tracker import RequestTracker
from edgemoe.server.windows import RateWindow, SampleWindow, percentile


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.floats(0, 200), st.integers(0, 50)), max_size=40), now_extra=st.floats(0, 100))
def test_rate_window_matches_brute_force(events: list[tuple[float, int]], now_extra: float) -> None:
    events.sort()
    window = RateWindow(span_s=60)
    for t, amount in events:
        window.add(amount, t)
    now = (events[-1][0] if events else 0.0) + now_extra
    # Whole seconds: an event counts while its second is within the last 60.
    expected = sum(a for t, a in events if math.floor(t) > math.floor(now) - 60)
    assert window.total(now) == expected


@given(values=st.lists(st.floats(0, 1e6), min_size=1, max_size=50), q=st.sampled_from([50, 90, 99, 100]))
def test_percentile_is_nearest_rank(values: list[float], q: int) -> None:
    ordered = sorted(values)
    got = percentile(ordered, q)
    assert got is not None
    assert sum(1 for v in ordered if v <= got) >= q / 100 * len(ordered)  # covers q% of the samples…
    assert sum(1 for v in ordered if v < got) < q / 100 * len(ordered)  # …and is the smallest that does


def test_sample_window_forgets_old_samples() -> None:
    window = SampleWindow(span_s=10)
    window.add(5.0, now=0.0)
    window.add(1.0, now=8.0)
    assert window.summary(now=9.0).count == 2
    late = window.summary(now=12.0)
    assert late.count == 1 and late.p50 == late.p99 == 1.0 and percentile([], 50) is None


def test_admission_gate() -> None:
    gate = AdmissionGate(max_queued=3)
    gate.check(queued=0, incoming=10, typical_wait_s=None)  # an empty queue admits anything
    gate.check(queued=1, incoming=2, typical_wait_s=None)
    with pytest.raises(Overloaded) as err:
        gate.check(queued=2, incoming=2, typical_wait_s=4.2)
    assert err.value.status == 429 and err.value.retry_after == pytest.approx(4.2)  # passed through min/max: exact
    with pytest.raises(Overloaded) as err:
        gate.check(queued=3, incoming=1, typical_wait_s=500.0)
    assert err.value.retry_after == 30.0


def test_request_log_keeps_the_newest() -> None:
    log = RequestLog(size=3)
    for i in range(5):
        log.add(RequestRecord(f"r{i}", "POST /x", "finished", 0.0, 1, 0, 1, None, None, None))
    assert [r.id for r in log.recent(10)] == ["r4", "r3", "r2"] and len(log) == 3
    assert [r.id for r in log.recent(1)] == ["r4"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _tracker(clock: Clock, max_queued: int = 1000, timeout: float | None = None) -> RequestTracker:
    holder: dict[str, Any] = {}
    metrics = ServerMetrics(lambda: "m", lambda: holder["t"].live_counts(), lambda: None)
    holder["t"] = RequestTracker(metrics, AdmissionGate(max_queued), timeout_s=timeout, clock=clock)
    return holder["t"]


ACTIONS = st.lists(st.tuples(st.sampled_from(["submit", "token", "finish", "abort", "tick"]), st.integers(0, 5)),
                   max_size=60)


@settings(max_examples=200, deadline=None)
@given(actions=ACTIONS)
def test_tracker_counts_match_a_reference(actions: list[tuple[str, int]]) -> None:
    """queued / running / finished counts, tokens and the log against a plain model."""
    clock = Clock()
    tracker = _tracker(clock)
    state: dict[str, str] = {}  # request id → "queued" | "running" | "done"
    tokens = 0
    for i, (action, k) in enumerate(actions):
        live = sorted(r for r, s in state.items() if s != "done")
        rid = live[k % len(live)] if live else None
        if action == "submit":
            tracker.on_submit([AddRequest(request_id=f"r{i}", prompt_ids=[1, 2, 3], params=SamplingParams())])
            state[f"r{i}"] = "queued"
        elif action == "token" and rid is not None:
            tracker.on_output(RequestOutput(request_id=rid, token_ids=[7] * (k + 1)))
            state[rid], tokens = "running", tokens + k + 1
        elif action == "finish" and rid is not None:
            tracker.on_output(RequestOutput(request_id=rid, finished=True, finish_reason="stop"))
            state[rid] = "done"
        elif action == "abort" and rid is not None:
            tracker.on_end([rid], "abort")
            state[rid] = "done"
        clock.now += 0.5
    values = list(state.values())
    assert tracker.live_counts() == (values.count("running"), values.count("queued"))
    assert sum(tracker.finish_counts.values()) == values.count("done") == len(tracker.log)
    assert sum(r.completion_tokens for r in tracker.log.recent(1000) + tracker.in_flight()) == tokens
    assert all(r.ttft_s is None for r in tracker.in_flight() if r.status == "queued")


def test_tracker_deadlines_and_admission() -> None:
    clock = Clock()
    tracker = _tracker(clock, max_queued=2, timeout=5.0)
    add = lambda rid: AddRequest(request_id=rid, prompt_ids=[1], params=SamplingParams())  # noqa: E731
    tracker.on_submit([add("a"), add("b")])
    with pytest.raises(Overloaded):
        tracker.on_submit([add("c")])
    tracker.on_output(RequestOutput(request_id="a", token_ids=[1]))  # a runs: one queue slot frees
    tracker.on_submit([add("c")])
    assert tracker.expired() == []
    clock.now += 4.9
    assert tracker.expired() == []
    clock.now += 0.1  # deadlines run from arrival (here: the submit, outside any HTTP request)
    assert sorted(tracker.expired()) == ["a", "b", "c"]
    tracker.on_end(["a", "b", "c"], "timeout", "too slow")
    assert tracker.finish_counts == {"timeout": 3} and tracker.log.recent(1)[0].error == "too slow"
