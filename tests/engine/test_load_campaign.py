"""Scheduler invariants under KV pressure (from the load campaign): random arrivals,
aborts, preemptions and out-of-KV finishes on a tiny pool, checked against a plain
model of who owns each page-table row.

`Engine.launch` rewrites a request's sampling row only when `sampling_row != row`, so a
(re)admitted request must never land on its old row number after another request's
sampling state was written there (it would sample with that request's parameters, or
find no state at all and crash the engine). The scheduler forgets a preempted request's
sampling row, so this holds whatever order the page table hands rows out in (checked
with a first-in-first-out table too, not only the real last-in-first-out one)."""

from __future__ import annotations

import random

import pytest
import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.page_table import PageTable
from edgemoe.cache.registry import make_prefix_cache
from edgemoe.config import SchedulerConfig
from edgemoe.engine.request import Request, Status
from edgemoe.engine.scheduler import Scheduler
from edgemoe.messages import SamplingParams


def _scheduler(rng: random.Random) -> Scheduler:
    pool = KVPool(1, rng.randrange(8, 30), 4, 1, 2, torch.float32, torch.device("cpu"))
    prefix = make_prefix_cache(rng.choice(["radix", "none"]), pool, None, None)
    cfg = SchedulerConfig(max_running_requests=rng.randrange(2, 6), max_prefill_tokens=rng.randrange(4, 20))
    return Scheduler(cfg, pool, prefix)


def _run(seed: int) -> None:
    rng = random.Random(seed)
    sched = _scheduler(rng)
    owner: dict[int, Request] = {}  # row -> the request whose sampling state it holds
    reqs: list[Request] = []
    target: dict[str, int] = {}

    def end(r: Request) -> None:  # what Engine._finish does with the row
        if r.row is not None:
            owner.pop(r.row, None)
        sched.finish(r)

    for step in range(300):
        if rng.random() < 0.3 and len(reqs) < 30:
            r = Request(f"r{len(reqs)}", [rng.randrange(50) for _ in range(rng.randrange(1, 20))], SamplingParams(),
                        arrival=step + rng.random())
            reqs.append(r)
            target[r.request_id] = rng.randrange(1, 40)
            sched.add(r)
        live = [r for r in reqs if r.status is not Status.FINISHED]
        if live and rng.random() < 0.05:
            end(rng.choice(live))  # an abort, running or waiting (preempted) alike
        plan = sched.schedule()
        for r in plan.out_of_kv:
            end(r)
        for s in plan.seqs:
            r = s.request
            if r.sampling_row != r.row:
                r.sampling_row = r.row  # Engine.launch: SamplingRows.assign
                owner[r.row] = r  # type: ignore[index]
            assert owner.get(r.row) is r, f"seed {seed} step {step}: {r.request_id} reuses row {r.row}"  # type: ignore[arg-type]
        for s in plan.seqs:
            r = s.request
            r.num_computed = s.start + s.length
            if s.samples:
                r.output_ids.append(rng.randrange(50))
                if len(r.output_ids) >= target[r.request_id]:
                    end(r)
    for r in reqs:
        if r.status is not Status.FINISHED:
            end(r)
    assert sched.pool.num_free + sched.prefix.total_pages == sched.pool.num_pages
    assert sched.page_table.num_free == sched.config.max_running_requests


def test_readmitted_requests_never_inherit_another_requests_sampling_row() -> None:
    for seed in range(60):
        _run(seed)


def test_row_ownership_does_not_depend_on_the_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    def first_in_first_out(self: PageTable) -> int:
        if not self._free:
            raise RuntimeError("all page-table rows are in use")
        return self._free.pop(0)

    monkeypatch.setattr(PageTable, "assign", first_in_first_out)
    for seed in range(60):
        _run(seed)
