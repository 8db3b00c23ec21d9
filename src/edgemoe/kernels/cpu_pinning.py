"""The C pool's workers pinned, one to a physical core (Linux); on by default.

Why: with the hybrid CPU share every core of the GPU machine is busy (the engine's thread
spin-waits, the bell thread polls, 14 workers run or spin between layers: 16 threads on
16 cores, docs/benchmarks.md). A woken worker the scheduler puts beside another busy thread
shares that core until the load balancer moves one, and a worker off its core while it
holds a task holds up its layer's call. Measured on the GPU machine (Qwen3.8 at 32K, 12
requests each way, docs/benchmarks.md "Pinned CPU workers"): floating, one request in five
ran 20–30% slow (up to 100 involuntary switches a token, steps to 43 ms); pinned, none did.
Pinned, the workers own the last cores and the engine's other threads float over the first.

`EDGEMOE_CPU_PIN`: `1` pins (as many workers as free cores allow), `0` never, unset
(auto) pins when the engine sized the pool itself (`EDGEMOE_CPU_THREADS` unset: a host
shared with other work floats) and every worker gets a core no other live pool of this
process holds; otherwise no worker is pinned. Cores held by a pool are released when it
closes, so engines in turn each pin.

The workers are found by name: each names itself "em-pool" when it starts (em_pool.h).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from edgemoe.kernels import cpu_isa

PIN_ENV = "EDGEMOE_CPU_PIN"
THREADS_ENV = "EDGEMOE_CPU_THREADS"
WORKER_NAME = "em-pool"

# NOTE: re-entrant. A dropped pool's `CpuExperts.__del__` releases its cores, and the
# collector may run it inside `pin_workers` (any allocation there can collect): with a
# plain lock the thread waited on itself (the CPU suite hung there, 2026-12-05).
_lock = threading.RLock()
_held: dict[int, int] = {}  # cpu -> pid of the process whose live pool holds it (fork: a child's copy is stale)


def pin_mode() -> str:
    """"on", "off" or "auto" from $EDGEMOE_CPU_PIN (anything else: a ValueError naming it)."""
    value = os.environ.get(PIN_ENV, "")
    modes = {"1": "on", "0": "off", "": "auto"}
    if value not in modes:
        raise ValueError(f"{PIN_ENV} must be 1 (pin the CPU pool's workers), 0 (never) or unset (auto); got {value!r}")
    return modes[value]


def pin_wanted(mode: str) -> bool:
    """Whether a new pool should try to pin in `mode` (`pin_mode()`): forced on, or auto
    with the pool sized by the engine."""
    return mode == "on" or (mode == "auto" and not os.environ.get(THREADS_ENV))


def thread_ids() -> set[int]:
    """This process's thread ids."""
    return {int(t.name) for t in Path(f"/proc/{os.getpid()}/task").iterdir()}


def task_texts(filename: str, among: set[int] | None = None) -> dict[int, str]:
    """{thread id: its /proc/<pid>/task/<tid>/<filename>} for this process's threads (or
    those in `among`); a thread that ended meanwhile is left out."""
    texts = {}
    for tid in thread_ids() if among is None else among:
        try:
            texts[tid] = Path(f"/proc/{os.getpid()}/task/{tid}/{filename}").read_text()
        except OSError:
            continue
    return texts


def named_threads(name: str, among: set[int] | None = None) -> set[int]:
    """Thread ids whose name is `name` (optionally only those in `among`)."""
    return {tid for tid, comm in task_texts("comm", among).items() if comm.strip() == name}


def new_workers(before: set[int], count: int, timeout: float = 2.0) -> set[int]:
    """The `count` pool workers started since `before` was taken (a worker names itself
    when it first runs: wait for them, up to `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = named_threads(WORKER_NAME, thread_ids() - before)
        if len(workers) >= count or time.monotonic() > deadline:
            return workers
        time.sleep(0.002)


def free_cores() -> list[int]:
    """One CPU per physical core this process may use and no live pool of it holds, in CPU order."""
    pid = os.getpid()
    return [c for c in cpu_isa.core_cpus(os.sched_getaffinity(0)) if _held.get(c) != pid]


def pin_workers(workers: set[int], all_or_none: bool = False) -> dict[int, int]:
    """Pins each worker to its own free core, the last cores first, and holds those cores
    until `release`; returns {thread id: cpu}. More workers than free cores: the rest float
    (`all_or_none`: then none is pinned)."""
    with _lock:
        cpus = free_cores()
        if all_or_none and len(cpus) < len(workers):
            return {}
        placed = {}
        for tid, cpu in zip(sorted(workers), reversed(cpus), strict=False):
            try:
                os.sched_setaffinity(tid, {cpu})
            except OSError:  # a thread that ended, or a cpuset that refuses: leave it floating
                continue
            placed[tid] = cpu
            _held[cpu] = os.getpid()
        return placed


def release(placed: dict[int, int]) -> None:
    """The cores of a closed pool's workers, free for the next pool."""
    with _lock:
        for cpu in placed.values():
            if _held.get(cpu) == os.getpid():
                del _held[cpu]
