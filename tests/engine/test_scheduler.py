"""Scheduler behaviour against a plain model of the rules: decodes every step, chunked
prefill within the budget, admission limits, preemption and page accounting."""

from __future__ import annotations

import random

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.config import SchedulerConfig
from edgemoe.engine.request import Request
from edgemoe.engine.scheduler import Scheduler
from edgemoe.messages import SamplingParams


def pool(pages: int, page_size: int = 4) -> KVPool:
    return KVPool(1, pages, page_size, 1, 2, torch.float32, torch.device("cpu"))


def run_step(sched: Scheduler, rng: random.Random) -> tuple[list, int]:
    """Schedule, then pretend the model ran: advance and append a token to samplers.
    Returns the scheduled chunks and how many of their tokens were prompt (not decode)."""
    plan = sched.schedule()
    prefill_tokens = sum(s.length for s in plan.seqs if s.request.num_remaining > 1)
    for s in plan.seqs:
        s.request.num_computed = s.start + s.length
        if s.samples:
            s.request.output_ids.append(rng.randrange(100))
    return list(plan.seqs), prefill_tokens


def test_decode_never_stalls_behind_a_long_prompt() -> None:
    sched = Scheduler(SchedulerConfig(max_running_requests=8, max_prefill_tokens=16), pool(512))
    rng = random.Random(0)
    short = Request("short", [1, 2, 3], SamplingParams())
    sched.add(short)
    run_step(sched, rng)  # short's prompt + first token
    sched.add(Request("long", list(range(200)), SamplingParams()))
    for _ in range(12):
        seqs, _ = run_step(sched, rng)
        by_id = {s.request.request_id: s for s in seqs}
        assert by_id["short"].length == 1  # one decode token, every step
        assert by_id["long"].length == 16  # the rest of the budget goes to the prompt
        assert sum(s.length for s in seqs if s.request.request_id != "short") <= 16


def test_a_short_request_behind_a_long_prompt_starts_at_the_next_step() -> None:
    """While a long prompt is prefilled, a request that arrives is admitted with half of the
    step's prompt budget: its short prompt is done in that step and it decodes from the next,
    while the long prompt keeps the other half (and the whole budget once nothing waits)."""
    sched = Scheduler(SchedulerConfig(max_running_requests=8, max_prefill_tokens=16), pool(512))
    rng = random.Random(0)
    long = Request("long", list(range(200)), SamplingParams())
    sched.add(long)
    assert run_step(sched, rng)[1] == 16  # alone: the whole budget
    short = Request("short", [1, 2, 3, 4, 5], SamplingParams())
    sched.add(short)
    seqs, prefill = run_step(sched, rng)
    by_id = {s.request.request_id: s for s in seqs}
    assert by_id["short"].length == 5 and by_id["long"].length == 11 and prefill == 16  # 8 + the 3 short left
    seqs, prefill = run_step(sched, rng)
    by_id = {s.request.request_id: s for s in seqs}
    assert by_id["short"].length == 1 and by_id["long"].length == 16  # short decodes; nothing waits


def test_the_share_no_admission_takes_goes_back_to_the_running_prompt() -> None:
    """A waiting request that cannot be admitted (the running limit) leaves the running
    prompt the whole budget; one that can't get pages leaves it what the admission didn't use."""
    sched = Scheduler(SchedulerConfig(max_running_requests=1, max_prefill_tokens=16), pool(512))
    rng = random.Random(0)
    sched.add(Request("long", list(range(200)), SamplingParams()))
    run_step(sched, rng)
    sched.add(Request("later", [1, 2, 3], SamplingParams()))
    assert run_step(sched, rng)[1] == 16  # the running limit: no admission, no share held
    tight = Scheduler(SchedulerConfig(max_running_requests=8, max_prefill_tokens=16), pool(2, page_size=16))
    tight.add(Request("long", list(range(40)), SamplingParams()))
    run_step(tight, rng)  # one page
    tight.add(Request("big", list(range(30)), SamplingParams()))  # no page left for it once long holds two
    seqs, prefill = run_step(tight, rng)
    assert [s.request.request_id for s in seqs] == ["long"] and prefill == 16 and not tight.waiting[0].pages


def test_random_workload_respects_limits_and_returns_every_page() -> None:
    rng = random.Random(1)
    kv = pool(40)
    cfg = SchedulerConfig(max_running_requests=3, max_prefill_tokens=9)
    sched = Scheduler(cfg, kv)
    reqs = [Request(f"r{i}", [1] * rng.randrange(1, 30), SamplingParams()) for i in range(12)]
    for r in reqs:
        sched.add(r)
    target = {r.request_id: rng.randrange(1, 12) for r in reqs}
    for _ in range(2000):
        if not sched.has_work():
            break
        seqs, prefill_tokens = run_step(sched, rng)
        assert len(sched.running) <= cfg.max_running_requests
        assert prefill_tokens <= cfg.max_prefill_tokens
        assert seqs or not sched.has_work()
        held = sum(len(r.pages) for r in sched.running) + sum(len(r.pages) for r in sched.waiting)
        assert held + kv.num_free == kv.num_pages
        for r in list(sched.running):
            assert len(r.pages) * kv.page_size >= r.num_computed
            if len(r.output_ids) >= target[r.request_id]:
                sched.finish(r)
    assert not sched.has_work()
    assert kv.num_free == kv.num_pages


def test_overlap_protocol_never_preempts_in_flight_tokens_nor_samples_past_limits() -> None:
    """The engine's overlap loop against a plain model of it: step N+1 is scheduled before
    step N's tokens are appended; a request's pending tokens count, it is never preempted
    while it has any, never samples past max_tokens or the context, and every page returns."""
    rng = random.Random(2)
    kv = pool(8)
    cfg = SchedulerConfig(max_running_requests=4, max_prefill_tokens=9)
    sched = Scheduler(cfg, kv, max_model_len=36)
    reqs = [Request(f"r{i}", [1] * rng.randrange(1, 30), SamplingParams(max_tokens=rng.randrange(1, 12)))
            for i in range(16)]
    for r in reqs:
        sched.add(r)
    in_flight: list[Request] = []
    finished: set[str] = set()
    preempted = out_of_kv = 0

    def complete(sampled: list[Request]) -> None:  # the engine's `complete`: append, stop rules
        for r in sampled:
            r.num_pending -= 1
            if r.request_id in finished:
                continue  # the token drawn after a stop is dropped
            r.output_ids.append(rng.randrange(100))
            if len(r.output_ids) >= (r.params.max_tokens or 0) or r.num_known >= 36 or rng.random() < 0.1:
                finished.add(r.request_id)
                sched.finish(r)

    for _ in range(3000):
        if not (sched.has_work() or in_flight):
            break
        if in_flight and sched.needs_room():
            complete(in_flight)
            in_flight = []
        before = {r.request_id: r.num_pending for r in sched.running}
        plan = sched.schedule()
        assert all(before.get(v.request_id, 0) == 0 for v in plan.preempted)
        preempted, out_of_kv = preempted + len(plan.preempted), out_of_kv + len(plan.out_of_kv)
        for s in plan.seqs:
            s.request.num_computed = s.start + s.length
        launched = [s.request for s in plan.seqs if s.samples]
        for r in launched:
            r.num_pending += 1
            assert r.num_generated <= (r.params.max_tokens or 0) and r.num_tokens <= 36
        complete(in_flight)
        for r in plan.out_of_kv:
            assert r.num_pending == 0
            if r.request_id not in finished:
                finished.add(r.request_id)
                sched.finish(r)
        in_flight = launched
        held = sum(len(r.pages) for r in sched.running) + sum(len(r.pages) for r in sched.waiting)
        assert held + kv.num_free == kv.num_pages
    assert not sched.has_work() and len(finished) == len(reqs)
    assert kv.num_free == kv.num_pages
    assert preempted and out_of_kv  # 32 tokens of KV: both happened (else this proves less)
