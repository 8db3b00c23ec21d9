"""Where the host's time went in each overlapped engine step, for benchmarks that must
explain a slow step rather than average it away.

`OverlapLoop.step` has three phases: *schedule* (the scheduler's plan), *launch* (the
step's batch, the MoE executor's per-step work — the live quota's controller among it —,
the graph replay or the eager forward, the sampler) and *complete* (waiting for the step
in flight's sampled ids, then appending them: the device's time shows here when the
host is ahead). A slow step whose launch is long was held on the host (a lazy module
load, a capture, an allocation); one whose complete is long was held on the device or
by what the device waited for (the CPU share's answer). The collector's pauses are
counted apart (`gc.callbacks`): a full collection lands in whichever phase allocated.

A long *complete* alone can't say which: the device slow, or the engine thread
descheduled while the device finished (2026-12-05: `auto`'s early slow steps, 207
involuntary switches in that run). So each record also carries the engine thread's
involuntary context switches during the step (`getrusage(RUSAGE_THREAD)`, ~1 µs) and,
with `device=True`, two CUDA events around the step's launch on the current stream: their
span is the device's time on the step (its waits on the bell or a copy included), and the
gap from the previous step's end the device's idle wait for the host.

With `cpu` (a reader of the CPU share's cumulative calls and their wall ns: the C calls'
own counters, host memory), each record also carries the CPU's calls and time since the
last: a slow step whose device waited on a slow CPU shows it there, one whose CPU was quick
points at the hand-off instead.

Off unless a caller sets `OverlapLoop.anatomy` (`edgemoe bench decode` does for its
decode phase): then four clock reads, a syscall and (on CUDA) two events a step. Not
thread-safe (the engine's loop).
"""

from __future__ import annotations

import gc
import resource
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("schedule", "launch", "complete")


@dataclass
class StepRecord:
    """One step's phases (ns, in `PHASES` order) and the collections that ran in it."""

    phases_ns: tuple[int, int, int]
    gc_ns: int = 0
    gc_generations: tuple[int, ...] = ()
    switches: int = 0  # the recording thread's involuntary context switches in the step
    events: tuple[Any, Any] | None = None  # CUDA events before and after the step's launch
    cpu: tuple[int, int] | None = None  # the CPU share's calls and their wall ns since the last record


@dataclass
class StepAnatomy:
    """The last `capacity` steps' records, oldest first; `start` hooks the collector."""

    capacity: int = 4096
    device: bool = False  # time each step's launch on the device with two CUDA events
    cpu: Callable[[], tuple[int, int]] | None = None  # the CPU share's calls and wall ns so far
    steps: deque[StepRecord] = field(init=False)
    _cpu_last: tuple[int, int] = field(init=False, default=(0, 0))
    _switches: int = field(init=False, default=0)
    _gc_ns: int = field(init=False, default=0)
    _gc_gens: list[int] = field(init=False, default_factory=list)
    _gc_since: int | None = field(init=False, default=None)
    _hooked: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.steps = deque(maxlen=self.capacity)

    def start(self) -> None:
        self._switches = _thread_switches()
        self._cpu_last = self.cpu() if self.cpu is not None else (0, 0)
        if not self._hooked:
            gc.callbacks.append(self._on_gc)
            self._hooked = True

    def stop(self) -> None:
        if self._hooked:
            gc.callbacks.remove(self._on_gc)
            self._hooked = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_since = time.perf_counter_ns()
        elif self._gc_since is not None:
            self._gc_ns += time.perf_counter_ns() - self._gc_since
            self._gc_gens.append(int(info.get("generation", -1)))
            self._gc_since = None

    def device_event(self) -> Any:
        """A timing event recorded now on the current CUDA stream (None: `device` off)."""
        if not self.device:
            return None
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def record(self, t0: int, t1: int, t2: int, t3: int, events: tuple[Any, Any] | None = None) -> None:
        """A step that began at `t0` (perf_counter_ns), scheduled until `t1`, launched until
        `t2` and completed at `t3` (`events`: `device_event()`s before and after its launch);
        the collections and switches since the last record are its own."""
        switches, self._switches = self._switches, _thread_switches()
        events = events if events is not None and None not in events else None
        cpu = None
        if self.cpu is not None:
            (calls, ns), (calls0, ns0) = self.cpu(), self._cpu_last
            cpu, self._cpu_last = (calls - calls0, ns - ns0), (calls, ns)
        self.steps.append(StepRecord((t1 - t0, t2 - t1, t3 - t2), self._gc_ns, tuple(self._gc_gens),
                                     self._switches - switches, events, cpu))
        self._gc_ns, self._gc_gens = 0, []


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux only


def _thread_switches() -> int:
    """The calling thread's involuntary context switches so far (0 where unsupported)."""
    return resource.getrusage(_RUSAGE_THREAD).ru_nivcsw if _RUSAGE_THREAD is not None else 0


def device_span(records: list[StepRecord], i: int) -> dict[str, float]:
    """Record `i`'s device span (`device_ms`: the launched step's work, from the device
    reaching it to its end) and the device's idle wait before it (`device_gap_ms`: from
    the previous record's end), where both carry events; {} otherwise."""
    here = records[i].events if 0 <= i < len(records) else None
    if here is None:
        return {}
    here[1].synchronize()
    out = {"device_ms": round(here[0].elapsed_time(here[1]), 2)}
    before = records[i - 1].events if i > 0 else None
    if before is not None:
        out["device_gap_ms"] = round(before[1].elapsed_time(here[0]), 2)
    return out


def slow_steps(step_seconds: list[float], anatomy: StepAnatomy, factor: float = 2.0,
               most: int = 8) -> list[dict[str, Any]]:
    """The `most` slowest of `step_seconds` (a benchmark's timing of the same steps, the
    last len(step_seconds) of `anatomy`'s) over `factor` × their median, slowest first,
    each with its phases, collections and involuntary switches, and with device events the
    device's time on the step it completed (`completed`: the one launched a step before)
    and on the one it launched (`launched`)."""
    records = list(anatomy.steps)[-len(step_seconds):] if step_seconds else []
    if not records or len(records) != len(step_seconds):
        return []
    median = statistics.median(step_seconds)
    slow = sorted((i for i, s in enumerate(step_seconds) if s > factor * median), key=lambda i: -step_seconds[i])
    return [{"step": i, "ms": round(1e3 * step_seconds[i], 2),
             **{f"{name}_ms": round(ns / 1e6, 2) for name, ns in zip(PHASES, records[i].phases_ns, strict=True)},
             "gc_ms": round(records[i].gc_ns / 1e6, 2), "gc_generations": list(records[i].gc_generations),
             "switches": records[i].switches, **cpu_part(records[i]),
             **({"completed": done} if (done := device_span(records, i - 1)) else {}),
             **({"launched": launched} if (launched := device_span(records, i)) else {})}
            for i in slow[:most]]


def cpu_part(record: StepRecord) -> dict[str, Any]:
    """`cpu_calls` and `cpu_ms` of a record that carries the CPU share's counters; {} otherwise."""
    return {} if record.cpu is None else {"cpu_calls": record.cpu[0], "cpu_ms": round(record.cpu[1] / 1e6, 2)}


def phase_totals(anatomy: StepAnatomy) -> dict[str, Any]:
    """Each phase's and the collector's ms over every recorded step, and the collections
    by generation."""
    records = list(anatomy.steps)
    totals = {f"{name}_ms": round(sum(r.phases_ns[k] for r in records) / 1e6, 2) for k, name in enumerate(PHASES)}
    gens = [g for r in records for g in r.gc_generations]
    spans = [device_span(records, i) for i in range(len(records))]
    device = {"device_ms": round(sum(s["device_ms"] for s in spans if s), 2),
              "device_gap_ms": round(sum(s.get("device_gap_ms", 0.0) for s in spans), 2)} if any(spans) else {}
    return {**totals, "gc_ms": round(sum(r.gc_ns for r in records) / 1e6, 2),
            "gc_collections": {str(g): gens.count(g) for g in sorted(set(gens))},
            "switches": sum(r.switches for r in records), **device,
            **({"cpu_ms": round(sum(r.cpu[1] for r in records if r.cpu) / 1e6, 2)} if anatomy.cpu else {})}
