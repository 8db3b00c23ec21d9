"""Continuous batching with chunked prefill.

Each step: every decoding request gets its one token first (decode never stalls behind
a long prompt), then prompt chunks fill up to `max_prefill_tokens`, first for requests
already running, then for newly admitted ones. While requests wait and a running prompt
is being prefilled, the running prompts leave half of that budget (`ADMIT_SHARE`) to
admissions, so a short request that arrives behind a long prompt starts at the next step
instead of after the whole long prefill; what the admissions could not use (no pages)
goes back to the running prompts' chunks in the same step. A prompt longer than the
budget is prefilled over several steps.

With a prefix cache, an admitted request starts from the longest cached prefix of its
tokens (pages shared, locked while in use) and a released request offers its computed
pages back to the cache. A stateful cache (hybrid models) also restores the GDN state
snapshot of the matched prefix into the request's state row, takes its snapshots back
on release, and wants prompt chunks to end on page boundaries (where snapshots can be
taken): a chunk short of the prompt's end stops at its last boundary, and a prompt's
last boundary before its final token ends a chunk of its own. When the pool runs dry, unlocked cached pages are evicted
first; then the most recently arrived running request is preempted (its computed pages
go to the cache, so the recompute is mostly a prefix hit). A request that cannot
grow even with every other page freed (the KV cache is smaller than its context) is
returned in `StepPlan.out_of_kv` to finish with `length`: never an exception, never a
preemption loop.

Each running request owns a row of the device page table (cache/page_table.py) from
admission to release; page ids are written into it when they are allocated.

Overlap scheduling (engine/overlap.py) schedules step N+1 before step N's sampled ids
reach the host: a request's pending tokens (`Request.num_pending`) count as positions,
so its next decode computes the pending token. A pending request at its `max_tokens` or
the context length is not scheduled again (step N's completion finishes it), and is
never a preemption victim: `needs_room()` tells the engine to complete the step in
flight first whenever the decodes need pages that only a preemption could give.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.page_table import PageTable
from edgemoe.cache.prefix_cache import NoPrefixCache, PrefixCache
from edgemoe.config import SchedulerConfig
from edgemoe.engine.request import Request, Status


# The share of a step's prompt budget the running prompts leave to admissions while
# requests wait: half lets a short request's prompt through in the next step and costs a
# long prefill at most half its pace while others arrive (vLLM's scheduler caps long
# prefills' chunks for the same reason).
ADMIT_SHARE = 0.5


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
        max_model_len: int | None = None,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
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
        # Running prefills can hold every page while none can grow: free the newest
        # (unless a step is in flight: its completion may free pages, so wait for it).
        while not plan.seqs and len(self.running) > 1 and not any(r.num_pending for r in self.running):
            victim = self._preempt_latest(exclude=self.running[0])
            if victim is None:
                break
            again = self._try_schedule()
            plan = StepPlan(
                again.seqs, plan.preempted + again.preempted + (victim,), plan.out_of_kv + again.out_of_kv
            )
        return plan

    def needs_room(self) -> bool:
        """Whether this step's decodes need more pages than are free or evictable, i.e.
        scheduling it would preempt a request or find one out of KV. With overlap, the
        engine then completes the step in flight first, so no such decision is taken on a
        request whose tokens are still on the device."""
        need = sum(max(0, self.pool.pages_for(r.num_tokens) - len(r.pages)) for r in self._decoding())
        return need > self.pool.num_free + self.prefix.evictable_pages

    def _decoding(self) -> list[Request]:
        """Running requests whose next step is a decode (one token left to compute)."""
        return [r for r in self.running if r.num_remaining == 1 and not self._at_limit(r)]

    def _at_limit(self, req: Request) -> bool:
        """A request whose pending tokens reach its max_tokens or the context length: the
        completion of the step in flight finishes it, so it samples nothing more."""
        if not req.num_pending:
            return False
        p = req.params
        full = self.max_model_len is not None and req.num_tokens >= self.max_model_len
        return full or (p.max_tokens is not None and req.num_generated >= p.max_tokens)

    def _try_schedule(self) -> StepPlan:
        preempted: list[Request] = []
        out_of_kv: list[Request] = []
        decodes = self._schedule_decodes(preempted, out_of_kv)
        budget = self.config.max_prefill_tokens
        prefilling = [r for r in self.running if r.num_remaining > 1]
        room = bool(self.waiting) and len(self.running) < self.config.max_running_requests
        held = int(budget * ADMIT_SHARE) if prefilling and room else 0  # the waiting's share
        chunks: list[ScheduledSeq] = []
        for req in prefilling:  # the running prompts first: their pages before a newcomer's
            seq = self._chunk(req, budget - held)
            if seq is None:
                break
            chunks.append(seq)
            budget -= seq.length
        admitted: list[ScheduledSeq] = []
        budget -= self._admit_waiting(admitted, budget)
        if held and budget > 0:  # what the waiting could not take goes back to the running prompts
            self._lengthen(chunks, budget)
        return StepPlan(tuple(decodes + chunks + admitted), tuple(preempted), tuple(out_of_kv))

    def _admit_waiting(self, seqs: list[ScheduledSeq], budget: int) -> int:
        """Admit waiting requests in arrival order, their first chunks within `budget`
        (appended to `seqs`), while pages and the running limit allow. Returns the tokens used."""
        used = 0
        while self.waiting and used < budget and len(self.running) < self.config.max_running_requests:
            seq = self._admit(self.waiting[0], budget - used)
            if seq is None:
                break
            req = self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            seqs.append(seq)
            used += seq.length
        return used

    def _lengthen(self, chunks: list[ScheduledSeq], budget: int) -> None:
        """Grow `chunks` (in place, in order) by up to `budget` tokens where pages allow."""
        for i, seq in enumerate(chunks):
            if budget <= 0:
                break
            longer = self._chunk(seq.request, seq.length + budget)
            if longer is not None and longer.length > seq.length:
                budget -= longer.length - seq.length
                chunks[i] = longer

    def _schedule_decodes(self, preempted: list[Request], out_of_kv: list[Request]) -> list[ScheduledSeq]:
        seqs: list[ScheduledSeq] = []
        for req in self._decoding():
            if req.status is not Status.RUNNING:
                continue  # preempted below while making room for an earlier one
            while not self.reserve(req, req.num_tokens):
                victim = self._preempt_latest(exclude=req)
                if victim is None:
                    if not any(r.num_pending for r in self.running if r is not req):
                        # Alone and still no page: the KV cache is smaller than this context.
                        out_of_kv.append(req)
                    break  # else: waits until the step in flight completes (`needs_room`)
                preempted.append(victim)
            else:
                seqs.append(ScheduledSeq(req, req.num_computed, 1))
        return [s for s in seqs if s.request.status is Status.RUNNING]

    def _chunk(self, req: Request, budget: int) -> ScheduledSeq | None:
        length = self._aligned(req, min(req.num_remaining, budget))
        if length <= 0 or not self.reserve(req, req.num_computed + length):
            return None
        return ScheduledSeq(req, req.num_computed, length)

    def _aligned(self, req: Request, length: int) -> int:
        """For a stateful cache, a prompt chunk ends on a page boundary when one lies inside
        it: the last one before the prompt's final token, or before the chunk's end."""
        if not self.prefix.stateful or req.num_remaining <= 1:
            return length
        ps, end = self.pool.page_size, req.num_computed + length
        boundary = (end if end < req.num_tokens else req.num_tokens - 1) // ps * ps
        return boundary - req.num_computed if boundary > req.num_computed else length

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
        self.prefix.restore_state(m, req.row)
        return seq

    def _headroom_after_admission(self) -> bool:
        """Admit only while every running decode can still take its next page: an
        admission that would force a preemption on the next step is a loop, not progress."""
        return self.pool.num_free + self.prefix.evictable_pages >= len(self._decoding())

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
        """Preempt the most recently arrived running request but `exclude`; never one with
        tokens still on the device (its recompute would need them). None: no candidate."""
        candidates = [r for r in self.running if r is not exclude and not r.num_pending]
        if not candidates:
            return None
        victim = max(candidates, key=lambda r: r.arrival)
        self.running.remove(victim)
        self._release_pages(victim)
        victim.num_computed = 0
        # Its row may be reused by another request before it returns: make the engine
        # rewrite the sampling state on readmission even if it gets the same row number.
        victim.sampling_row = None
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
            result = self.prefix.insert(req.token_slice(0, req.num_computed), req.pages, req.snapshots)
            self.pool.free(result.to_free)
            self.prefix.unlock(req.prefix_handle)
        req.snapshots = []
        if req.row is not None:
            self.page_table.release(req.row)
        req.pages, req.prefix_handle, req.row = [], None, None
