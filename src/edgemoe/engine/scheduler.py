"""Continuous batching with chunked prefill.

Each step: every decoding request gets its one token first (decode never stalls behind
a long prompt), then prompt chunks fill up to `max_prefill_tokens`, first for requests
already running, then for newly admitted ones. A prompt longer than the budget is
prefilled over several steps.

With a prefix cache, an admitted request starts from the longest cached prefix of its
tokens (pages shared, locked while in use) and a released request offers its computed
pages back to the cache. When the pool runs dry, unlocked cached pages are evicted
first; then the most recently arrived running request is preempted (its computed pages
go to the cache, so the recompute is mostly a prefix hit). A request that cannot
grow even with every other page freed (the KV cache is smaller than its context) is
returned in `StepPlan.out_of_kv` to finish with `length`: never an exception, never a
preemption loop.

Each running request owns a row of the device page table (cache/page_table.py) from
admission to release; page ids are written into it when they are allocated.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.page_table import PageTable
from edgemoe.cache.prefix_cache import NoPrefixCache, PrefixCache
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
    out_of_kv: tuple[Request, ...] = ()  # cannot grow even alone: finish with `length`

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.seqs)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        pool: KVPool,
        prefix: PrefixCache | None = None,
        page_table: PageTable | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.prefix = prefix or NoPrefixCache(pool.page_size)
        # A table of its own when none is shared (tests of the scheduler alone).
        self.page_table = page_table or PageTable(
            config.max_running_requests, pool.num_pages, pool.k.device, pool.scratch_page
        )
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
            again = self._try_schedule()
            plan = StepPlan(
                again.seqs, plan.preempted + again.preempted + ((victim,) if victim else ()),
                plan.out_of_kv + again.out_of_kv,
            )
        return plan

    def _try_schedule(self) -> StepPlan:
        preempted: list[Request] = []
        out_of_kv: list[Request] = []
        seqs = self._schedule_decodes(preempted, out_of_kv)
        budget = self.config.max_prefill_tokens
        for req in [r for r in self.running if r.num_remaining > 1]:
            seq = self._chunk(req, budget)
            if seq is None:
                break
            seqs.append(seq)
            budget -= seq.length
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_requests:
            seq = self._admit(self.waiting[0], budget)
            if seq is None:
                break
            req = self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            seqs.append(seq)
            budget -= seq.length
        return StepPlan(tuple(seqs), tuple(preempted), tuple(out_of_kv))

    def _schedule_decodes(self, preempted: list[Request], out_of_kv: list[Request]) -> list[ScheduledSeq]:
        seqs: list[ScheduledSeq] = []
        for req in [r for r in self.running if r.num_remaining == 1]:
            if req.status is not Status.RUNNING:
                continue  # preempted below while making room for an earlier one
            while not self.reserve(req, req.num_tokens):
                victim = self._preempt_latest(exclude=req)
                if victim is None:
                    # Alone and still no page: the KV cache is smaller than this context.
                    out_of_kv.append(req)
                    break
                preempted.append(victim)
            else:
                seqs.append(ScheduledSeq(req, req.num_computed, 1))
        return [s for s in seqs if s.request.status is Status.RUNNING]

    def _chunk(self, req: Request, budget: int) -> ScheduledSeq | None:
        length = min(req.num_remaining, budget)
        if length <= 0 or not self.reserve(req, req.num_computed + length):
            return None
        return ScheduledSeq(req, req.num_computed, length)

    def _admit(self, req: Request, budget: int) -> ScheduledSeq | None:
        """Start a waiting request from its longest cached prefix; None if no pages."""
        query = req.token_slice(0, req.num_tokens - 1)  # the last token is always computed
        m = self.prefix.match(query, record=False)
        self.prefix.lock(m.handle)
        req.pages, req.num_computed, req.prefix_handle = list(m.pages), m.num_tokens, m.handle
        req.row = self.page_table.assign()
        self.page_table.write(req.row, 0, req.pages)
        seq = self._chunk(req, budget)
        if seq is not None and not self._headroom_after_admission():
            self.pool.free(req.pages[len(m.pages) :])  # undo the chunk's reservation
            seq = None
        if seq is None:
            self.prefix.unlock(m.handle)
            self.page_table.release(req.row)
            req.pages, req.num_computed, req.prefix_handle, req.row = [], 0, None, None
            return None
        if req.num_cached is None:  # count each request's lookup once, not its retries
            req.num_cached = m.num_tokens
            self.prefix.record_query(len(query), m.num_tokens)
        return seq

    def _headroom_after_admission(self) -> bool:
        """Admit only while every running decode can still take its next page: an
        admission that would force a preemption on the next step is a loop, not progress."""
        decoding = sum(1 for r in self.running if r.num_remaining == 1)
        return self.pool.num_free + self.prefix.evictable_pages >= decoding

    def reserve(self, req: Request, num_tokens: int) -> bool:
        """Grow the request's pages to hold `num_tokens` positions, if pages allow
        (evicting unlocked cached prefixes first); new page ids go into its table row."""
        need = self.pool.pages_for(num_tokens) - len(req.pages)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            self.prefix.evict(need - self.pool.num_free)
        if need > self.pool.num_free:
            return False
        new = self.pool.alloc(need)
        if req.row is not None:
            self.page_table.write(req.row, len(req.pages), new)
        req.pages.extend(new)
        return True

    def _preempt_latest(self, exclude: Request) -> Request | None:
        candidates = [r for r in self.running if r is not exclude]
        if not candidates:
            return None
        victim = max(candidates, key=lambda r: r.arrival)
        self.running.remove(victim)
        self._release_pages(victim)
        victim.num_computed = 0
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        return victim

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted request and return its pages."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release_pages(req)
        req.status = Status.FINISHED

    def _release_pages(self, req: Request) -> None:
        """Offer the computed pages to the prefix cache, free the rest, unlock the match."""
        if req.prefix_handle is None:
            self.pool.free(req.pages)
        else:
            result = self.prefix.insert(req.token_slice(0, req.num_computed), req.pages)
            self.pool.free(result.to_free)
            self.prefix.unlock(req.prefix_handle)
        if req.row is not None:
            self.page_table.release(req.row)
        req.pages, req.prefix_handle, req.row = [], None, None
