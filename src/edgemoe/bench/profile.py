"""`edgemoe bench decode --profile`: where a decode step's time goes.

After a run's prefill, `profile_decode` times `steps` decode steps region by region
with the engine's `StepProfiler` (CUDA events: attention, moe and its copies, lm_head,
sampling; CPU experts as host time; `gap_ms` = the device idle or running unlabelled
work, i.e. waiting for the host), then traces single steps with torch.profiler to count
kernel launches and host synchronisations per step.
"""

from __future__ import annotations

import statistics
from typing import Any

from edgemoe.bench.api_trace import count_api_calls

TRACED_STEPS = 3  # steps traced for launch/sync counts (the profiler is slow)


def mean_regions(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean milliseconds per step of every region seen (0 where a step lacked it)."""
    keys = sorted({k for r in rows for k in r})
    return {k: statistics.fmean(r.get(k, 0.0) for r in rows) for k in keys}


def profile_decode(llm: Any, request_ids: set[str], steps: int) -> dict[str, Any]:
    """Profile up to `steps` decode steps of the running requests (they keep running)."""
    engine = llm.engine
    profiler = engine.profiler
    profiler.enabled = True
    try:
        for _ in range(steps):
            if not engine.has_work():
                break
            engine.step()
        rows = profiler.resolve()
    finally:
        profiler.enabled = False
    result: dict[str, Any] = {"steps": len(rows), "regions_ms": mean_regions(rows) if rows else {}}
    if engine.runtime.device.type == "cuda":
        counts = [count_api_calls(engine.step) for _ in range(TRACED_STEPS) if engine.has_work()]
        if counts:
            result["launches_per_step"] = statistics.fmean(c.launches for c in counts)
            result["syncs_per_step"] = statistics.fmean(c.syncs for c in counts)
            result["graph_launches_per_step"] = statistics.fmean(c.graph_launches for c in counts)
            result["runtime_calls"] = counts[-1].by_name
    return result


def format_profile(p: dict[str, Any]) -> str:
    regions = p.get("regions_ms", {})
    parts = [f"{k} {v:.2f}" for k, v in regions.items() if k not in ("wall_ms",)]
    line = "  profile ms/step: " + ", ".join(parts)
    if "syncs_per_step" in p:
        line += f"\n  launches/step {p['launches_per_step']:.0f}, host syncs/step {p['syncs_per_step']:.1f}"
    return line
