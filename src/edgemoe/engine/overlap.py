"""Overlap scheduling (`--overlap`): the engine loop with one step in flight.

`OverlapLoop.step()` schedules and launches step N+1, then completes step N: while the
device computes N+1, the host waits for N's ids (copied while N+1 was being prepared),
appends them and applies the stop rules, so neither side idles for the other.

What keeps the outputs exactly the serial loop's (`Engine.step` without the switch):
- A request sampled by N has a pending token (`Request.num_pending`) when N+1 is
  scheduled: its decode in N+1 stages `PENDING` and reads the id on the device
  (`BatchBuffers.last_token`, written after every draw); positions, pages, `min_tokens`
  (the sampler's generated count) and the limits count pending tokens. The sampler's
  per-row state (draw counters, penalty counts) is updated on the device at each draw,
  as in the serial loop, so it sees every token once.
- Stop rules run one step behind: when N's token finishes a request, the token N+1 drew
  for it is dropped at N+1's completion (never appended, never streamed). A request at
  its `max_tokens` or the context length counting pending tokens is not scheduled again.
- A finished or aborted request's pages and rows are released at once, while N+1 may
  still write its KV, sampling row and GDN state: NOTE: safe because every consumer of
  them (the next steps' kernels, page-table flushes, state copies, the host tier's
  copies) runs on the same stream after N+1's work; a second stream touching them must
  wait for the step's event first. The prefix cache gets only known tokens' KV
  (`num_computed` never counts the dropped token: nothing computes it).
- Decisions that need every token on the host first: when the decodes need pages that
  only a preemption could give (`Scheduler.needs_room`), the step in flight is completed
  before scheduling (this step runs serially), and so is it while a structured output
  runs whose next mask follows its last token (`Engine.needs_host_tokens`; one inside a
  think block does not wait: a tool-call constraint's mask is None whatever the token, a
  JSON output's is picked on the device from the token in flight, the value's first
  where it is the close);
  requests found out of KV are finished
  after the completion (a stop rule may have ended them); a failed launch is completed
  (failed) at once.
- The stateful prefix cache's tool-call opener check waits for the token
  (`Engine.check_openers`), before the next launch moves the rolling snapshot.
"""

from __future__ import annotations

import time
from typing import Generic, Protocol, TypeVar

from edgemoe.engine.runner import HostResult
from edgemoe.engine.scheduler import Scheduler, StepPlan
from edgemoe.engine.step_anatomy import StepAnatomy
from edgemoe.messages import RequestOutput


class LaunchedStep(Protocol):
    """A launched step (`engine.StepHandle`): `result` is None when its launch failed."""

    @property
    def result(self) -> HostResult | None: ...


H = TypeVar("H", bound=LaunchedStep)


class SteppedEngine(Protocol[H]):
    """What the loop drives (`Engine`, its handles `StepHandle`): schedule, launch,
    complete, and the checks that need a step's tokens on the host."""

    scheduler: Scheduler

    def launch(self, plan: StepPlan) -> H: ...
    def complete(self, handle: H) -> list[RequestOutput]: ...
    def finish_out_of_kv(self, plan: StepPlan) -> list[RequestOutput]: ...
    def check_openers(self, handle: H) -> None: ...
    def needs_host_tokens(self) -> bool: ...


class OverlapLoop(Generic[H]):
    """Drives `Engine.launch`/`complete` one step apart. Not thread-safe (the engine's loop)."""

    def __init__(self, engine: SteppedEngine[H]) -> None:
        self.engine = engine
        self.in_flight: H | None = None
        self.anatomy: StepAnatomy | None = None  # each step's phases, when a benchmark asks

    def step(self) -> list[RequestOutput]:
        """Launch the next step, then complete the one in flight; returns its outputs."""
        e, clock = self.engine, time.perf_counter_ns
        t0 = clock()
        outputs: list[RequestOutput] = []
        if self.in_flight is not None and (e.scheduler.needs_room() or e.needs_host_tokens()):
            outputs += self.drain()  # preemption / out-of-KV decisions, structured outputs' masks see every token
        plan = e.scheduler.schedule()
        t1 = clock()
        begin = self.anatomy.device_event() if self.anatomy is not None else None
        handle = e.launch(plan) if plan.seqs else None
        events = (begin, self.anatomy.device_event()) if self.anatomy is not None else None
        t2 = clock()
        outputs += self.drain()
        if self.anatomy is not None:
            self.anatomy.record(t0, t1, t2, clock(), events)
        outputs += e.finish_out_of_kv(plan)
        if handle is not None and handle.result is None:
            outputs += e.complete(handle)  # the launch failed: fail its requests now
            handle = None
        if handle is not None:
            e.check_openers(handle)
        self.in_flight = handle
        return outputs

    def drain(self) -> list[RequestOutput]:
        """Complete the step in flight, if any (waits for its sampled ids)."""
        handle, self.in_flight = self.in_flight, None
        return self.engine.complete(handle) if handle is not None else []
