"""`EDGEMOE_CPU_PIN=1`: the C pool's workers pinned, one to a physical core (Linux).

Why: with the hybrid CPU share every core of the GPU machine is busy (the engine's thread
spin-waits, the bell thread polls, 14 workers run or spin between layers: 16 threads on
16 cores, docs/benchmarks.md). A woken worker the scheduler puts beside another busy thread
shares that core until the load balancer moves one, and a worker off its core while it
holds a task holds up its layer's call. Pinned, the workers own the last `n` cores and
the engine's other threads float over the first ones. Off by default until measured (an
A/B: `gpu_qwen4_bench.py`'s `-pin` configurations).

The workers are found by name: each names itself "em-pool" when it starts (em_pool.h).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from edgemoe.kernels import cpu_isa

PIN_ENV = "EDGEMOE_CPU_PIN"
WORKER_NAME = "em-pool"


def pin_requested() -> bool:
    return os.environ.get(PIN_ENV, "0") == "1"


def thread_ids() -> set[int]:
    """This process's thread ids."""
    return {int(t.name) for t in Path(f"/proc/{os.getpid()}/task").iterdir()}


def named_threads(name: str, among: set[int] | None = None) -> set[int]:
    """Thread ids whose name is `name` (optionally only those in `among`)."""
    found = set()
    for tid in thread_ids() if among is None else among:
        try:
            if Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().strip() == name:
                found.add(tid)
        except OSError:  # a thread that ended meanwhile
            continue
    return found


def new_workers(before: set[int], count: int, timeout: float = 2.0) -> set[int]:
    """The `count` pool workers started since `before` was taken (a worker names itself
    when it first runs: wait for them, up to `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = named_threads(WORKER_NAME, thread_ids() - before)
        if len(workers) >= count or time.monotonic() > deadline:
            return workers
        time.sleep(0.002)


def pin_workers(workers: set[int]) -> dict[int, int]:
    """Pins each worker to its own core, the last cores of the allowed set first; returns
    {thread id: cpu}. More workers than cores: the rest stay unpinned."""
    cpus = cpu_isa.core_cpus(os.sched_getaffinity(0))
    placed = {}
    for tid, cpu in zip(sorted(workers), reversed(cpus), strict=False):
        try:
            os.sched_setaffinity(tid, {cpu})
        except OSError:  # a thread that ended, or a cpuset that refuses: leave it floating
            continue
        placed[tid] = cpu
    return placed
