"""Continuous batching with chunked prefill.

Each step: every decoding request gets its one token first (decode never stalls behind
a long prompt), then prompt chunks fill up to `max_prefill_tokens`, first for requests
already running, then for newly admitted ones. A prompt longer than the budget is
prefilled over several steps. When the KV pool runs dry, the most recently arrived
running request is preempted (its pages freed, recomputed later).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from edgemoe.cache.kv_pool import KVPool
from edgemoe.config import SchedulerConfig
from edgemoe.engine.request import Request, Status


@dataclass(frozen=True)
class ScheduledSeq:
    """Compute tokens [start, start + length) of `request`; sample after them if `samples`."""

    request: Request
    start: int
    length: int

    @property
    def samples(self) -> bool:
        return self.start + self.length == self.request.num_tokens


@dataclass(frozen=True)
class StepPlan:
    seqs: tuple[ScheduledSeq, ...]
    preempted: tuple[Request, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: KVPool) -> None:
        self.config = config
        self.pool = pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = self._try_schedule()
        # Running prefills can hold every page while none can grow: free the newest.
        while not plan.seqs and len(self.running) > 1:
            victim = self._preempt_latest(exclude=self.running[0])
            plan = self._try_schedule()
            plan = StepPlan(plan.seqs, plan.preempted + ((victim,) if victim else ()))
        return plan

    def _try_schedule(self) -> StepPlan:
        preempted: list[Request] = []
        seqs = self._schedule_decodes(preempted)
        budget = self.config.max_prefill_tokens
        for req in [r for r in self.running if r.num_remaining > 1]:
            seq = self._chunk(req, budget)
            if seq is None:
                break
            seqs.append(seq)
            budget -= seq.length
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_requests:
            seq = self._chunk(self.waiting[0], budget)
            if seq is None:
                break
            req = self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            seqs.append(seq)
            budget -= seq.length
        return StepPlan(tuple(seqs), tuple(preempted))

    def _schedule_decodes(self, preempted: list[Request]) -> list[ScheduledSeq]:
        seqs: list[ScheduledSeq] = []
        for req in [r for r in self.running if r.num_remaining == 1]:
            if req.status is not Status.RUNNING:
                continue  # preempted below while making room for an earlier one
            while not self._reserve(req, req.num_tokens):
                victim = self._preempt_latest(exclude=req)
                if victim is None:
                    raise RuntimeError("KV pool cannot hold a single request (kv_tokens too small)")
                preempted.append(victim)
            seqs.append(ScheduledSeq(req, req.num_computed, 1))
        return [s for s in seqs if s.request.status is Status.RUNNING]

    def _chunk(self, req: Request, budget: int) -> ScheduledSeq | None:
        length = min(req.num_remaining, budget)
        if length <= 0 or not self._reserve(req, req.num_computed + length):
            return None
        return ScheduledSeq(req, req.num_computed, length)

    def _reserve(self, req: Request, num_tokens: int) -> bool:
        """Grow the request's page table to hold `num_tokens` positions, if pages allow."""
        need = self.pool.pages_for(num_tokens) - len(req.pages)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.pages.extend(self.pool.alloc(need))
        return True

    def _preempt_latest(self, exclude: Request) -> Request | None:
        candidates = [r for r in self.running if r is not exclude]
        if not candidates:
            return None
        victim = max(candidates, key=lambda r: r.arrival)
        self.running.remove(victim)
        self.pool.free(victim.pages)
        victim.pages, victim.num_computed = [], 0
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        return victim

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted request and return its pages."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.pool.free(req.pages)
        req.pages = []
        req.status = Status.FINISHED
