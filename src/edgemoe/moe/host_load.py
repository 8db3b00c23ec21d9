"""How many of this process's CPUs other work keeps busy: `auto`'s reason not to try a CPU
share on a host that is not its own (`moe/quota_auto.py`).

A CPU share runs a worker on every core but one. Where other processes (a build, a
browser, another engine) or the hypervisor (a VM's stolen time) hold some of those cores,
the share's workers queue behind them: with four busy processes beside each run on the GPU
machine (docs/benchmarks.md, 2026-12-05 18:51 and 19:09) a share visit's steps ran 7–11 ms
against offload's 4.5 (93–142 ms before the detached calls), and the survey's visits alone
cost auto 5–6% of offload's speed. Counting the others' use of our cores costs two small
/proc reads.

Others' cores = (busy + stolen time of the CPUs this process may run on − this process's
own CPU time and its parent's: `edgemoe serve`'s server process, whose HTTP work is the
engine's own) ÷ the interval, from /proc/stat's per-CPU lines and /proc/self/stat, over
intervals of at least `span` seconds (the counters tick 100 times a second: a shorter
interval reads mostly their granularity). Linux only; elsewhere nothing is known (None).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

SPAN_S = 0.25  # the shortest interval a reading covers (25 ticks a CPU)
_BUSY = (1, 2, 3, 6, 7, 8)  # user nice system (idle iowait) irq softirq steal: /proc/stat's columns 1..8


class Sample(NamedTuple):
    at: float  # monotonic seconds
    busy: int  # busy and stolen ticks of the allowed CPUs
    own: int  # this process's (and its parent's) user + system ticks


def cpu_ticks(proc_stat: str) -> int | None:
    """utime + stime (fields 14, 15) of a /proc/PID/stat text; None if it doesn't parse."""
    after = proc_stat[proc_stat.rfind(")") + 2 :].split()  # from field 3 (state) on
    return int(after[11]) + int(after[12]) if len(after) >= 13 else None


def read_sample(stat: str, self_stat: str, cpus: set[int], at: float, parent_stat: str = "") -> Sample | None:
    """A sample from /proc/stat's and /proc/self/stat's texts (and the parent's, counted as
    ours where it parses), for the CPUs `cpus`; None if they don't parse (not Linux's format)."""
    busy, seen = 0, 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        fields = rest.split()
        busy += sum(int(fields[i - 1]) for i in _BUSY if i <= len(fields))
        seen += 1
    own = cpu_ticks(self_stat)
    if not seen or own is None:
        return None
    return Sample(at, busy, own + (cpu_ticks(parent_stat) or 0))


def _allowed_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _proc_sample() -> Sample | None:
    try:
        return read_sample(Path("/proc/stat").read_text(), Path("/proc/self/stat").read_text(), _allowed_cpus(),
                           time.monotonic(), _read(f"/proc/{os.getppid()}/stat"))
    except (OSError, ValueError, IndexError):
        return None


class HostLoad:
    """`others()`: the cores of this process's CPUs other work kept busy over the latest
    interval of at least `span` seconds that ended by now (None: none yet, or no /proc).
    `sample`: the counters' reader (tests pass their own)."""

    def __init__(self, span: float = SPAN_S, sample: Callable[[], Sample | None] = _proc_sample) -> None:
        self.span, self._sample = span, sample
        self._start = sample()
        self._reading: float | None = None

    def others(self) -> float | None:
        now = self._sample()
        if now is None or self._start is None:
            self._start = now
            return self._reading
        seconds = now.at - self._start.at
        if seconds >= self.span:
            hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
            self._reading = max(0.0, (now.busy - self._start.busy - (now.own - self._start.own)) / hz / seconds)
            self._start = now
        return self._reading


def busy_cores_limit() -> float:
    """`EDGEMOE_AUTO_BUSY_CORES`: others' cores past which auto doesn't try a CPU share
    (default 2: each core of other work displaces a worker, but a quiet GPU host read up to
    0.8 with nothing but `nvidia-smi` polling beside it, and a desktop's light load must not
    cost bf16 its share's ~15%; four busy processes read 4.0; 0: never)."""
    raw = os.environ.get("EDGEMOE_AUTO_BUSY_CORES", "2")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"EDGEMOE_AUTO_BUSY_CORES must be a number of cores (0: off): {raw!r}") from None
    if value < 0 or value != value:
        raise ValueError(f"EDGEMOE_AUTO_BUSY_CORES must be a number of cores >= 0 (0: off): {raw!r}")
    return value or float("inf")
