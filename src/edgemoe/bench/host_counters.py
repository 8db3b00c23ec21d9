"""What the host did around a timed phase, from Linux's counters (empty elsewhere).

Why: a decode whose CPU experts slow by ~40% for a whole request, with the same work,
is either this process's threads sharing cores (involuntary context switches of the C
pool's workers), the machine giving CPU time away (a VM's steal time), or the kernel
busy with memory (reclaim and compaction scans): these counters tell them apart.

    before = host_counters()
    ...  # the phase
    delta = counters_delta(before, host_counters())
    note = disturbance(delta, steps)  # a line when the host, not the engine, set the pace
"""

from __future__ import annotations

import os
from pathlib import Path

from edgemoe.kernels.cpu_pinning import task_texts
from edgemoe.moe.host_load import cpu_ticks

# /proc/stat's "cpu" line, in order (USER_HZ ticks since boot).
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# /proc/vmstat counters of the kernel working on memory: page reclaim and compaction.
_VM_PREFIXES = ("pgscan_", "pgsteal_", "compact_stall", "compact_migrate_scanned", "thp_collapse_alloc")


def _cpu_ticks() -> dict[str, int]:
    line = Path("/proc/stat").read_text().splitlines()[0].split()
    return {f"cpu_{name}_ticks": int(v) for name, v in zip(_CPU_FIELDS, line[1:], strict=False)}


def _vm_events() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(_VM_PREFIXES):
            out[f"vm_{name}"] = int(value)
    return out


def _context_switches() -> dict[str, int]:
    """This process's threads' context switches, summed: involuntary ones mean a runnable
    thread was taken off its core (more runnable threads than cores)."""
    voluntary = involuntary = 0
    for status in task_texts("status").values():
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                involuntary += int(line.split()[1])
    return {"ctx_switches_voluntary": voluntary, "ctx_switches_involuntary": involuntary}


def thread_ticks() -> dict[str, int]:
    """Each of this process's threads' CPU time (user + system ticks), by "tid name"."""
    out: dict[str, int] = {}
    for tid, stat in task_texts("stat").items():
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[f"{tid} {name}"] = cpu_ticks(stat) or 0
    return out


def busy_threads(before: dict[str, int], after: dict[str, int], seconds: float, least: float = 0.05) -> list[list]:
    """[thread, share of the phase's wall time on a core] for the threads busy at least
    `least` of it, busiest first: more busy threads than cores means workers were queued."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    shares = [[t, round((after[t] - before.get(t, 0)) / hz / seconds, 3)] for t in after] if seconds > 0 else []
    return sorted((s for s in shares if s[1] >= least), key=lambda s: -s[1])


def host_counters() -> dict[str, int]:
    """A snapshot of the counters; {} where /proc doesn't have them (not Linux)."""
    try:
        return {**_cpu_ticks(), **_vm_events(), **_context_switches()}
    except (OSError, ValueError, IndexError):
        return {}


def counters_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """after - before per counter both have, and the machine's CPU time split as shares of
    its ticks (steal: time the hypervisor gave to others)."""
    delta = {k: after[k] - before[k] for k in before.keys() & after.keys()}
    ticks = sum(delta.get(f"cpu_{name}_ticks", 0) for name in _CPU_FIELDS)
    shares = {f"cpu_{name}_share": delta.get(f"cpu_{name}_ticks", 0) / ticks for name in _CPU_FIELDS} if ticks else {}
    return {**dict(sorted(delta.items())), **shares}


# Past these a phase's figures measure the host more than the engine. On the GPU machine
# a fresh VM's first minutes decoded issue 13's scenario at 33 tok/s with 8% of the CPU
# time stolen and ~50 involuntary switches a step, 51 tok/s a minute later at 0.08% and
# ~0.5 (bench/results/decode-20261203-235*.json): the same build.
STEAL_SHARE_NOTED = 0.01
SWITCHES_PER_STEP_NOTED = 5.0
# Ticks (1/100 s of one CPU) a phase must span before its steal share is judged: a share
# of a few ticks is the accounting's granularity, not the host.
STEAL_TICKS_JUDGED = 200


def disturbance(delta: dict[str, float], steps: int | None = None) -> str | None:
    """A warning when the host disturbed a phase: the hypervisor took CPU time (steal) or,
    given the phase's `steps`, this process's threads were taken off their cores
    (involuntary context switches a step; None: steal alone, for a phase whose threads
    outnumber the cores by design). None when nothing passed its threshold or nothing was
    counted."""
    ticks = sum(delta.get(f"cpu_{name}_ticks", 0) for name in _CPU_FIELDS)
    steal = delta.get("cpu_steal_share", 0.0) if ticks >= STEAL_TICKS_JUDGED else 0.0
    switches = delta.get("ctx_switches_involuntary", 0) / max(steps, 1) if steps is not None else 0.0
    if steal < STEAL_SHARE_NOTED and switches < SWITCHES_PER_STEP_NOTED:
        return None
    counted = f", {switches:.1f} involuntary context switches a step" if steps is not None else ""
    return (f"host disturbed: {100 * steal:.1f}% of the CPU time stolen by the hypervisor{counted}: these figures "
            "measure the host; run again")
