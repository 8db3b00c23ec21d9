"""Where a resident decode step's device time goes, kernel by kernel, on the GPU machine.

random:qwen3-30b-a3b (bf16, 48 layers) resident, one request after a 1K prompt, decode
steps replayed from CUDA graphs; the torch profiler (CUPTI sees the kernels inside a
graph) over STEPS steps. Prints each kernel's µs per step, its share and calls per step,
and writes $OUT/kernel_profile_b<batch>_p<prompt>.json. The bound to compare with:
PERF-NOTES' 680 tok/s at batch 1, 1.47 ms a step (docs/benchmarks.md: per layer).

    PYTHONPATH=/tmp/site:src python3 scripts/gpu_kernel_profile.py [batch] [prompt_tokens] [setting=value ...]

Settings after the first two arguments replace the resident defaults, e.g. the offload
scenario with the device expert cache: `1 1024 moe_backend=offload gpu_memory=16GiB
kv_tokens=8192` (values that read as integers are passed as integers). The output file's
name then carries them.

NOTE: programmatic dependent launch is turned off here unless EDGEMOE_PDL is set: with it
each kernel starts early and waits inside for its predecessor, so CUPTI's per-kernel times
overlap and no longer add up to the step (2026-12-02: 4,649 µs of kernels in a 3.14 ms
step, `_down_gemv` at 21.8 µs a layer against 8.1 in the kernel bench). The step without
PDL is ~8% longer; the shares are what this script is for.

It also sums the device's idle gaps between kernels by the kernel that came next: with the
CPU share (`moe_backend=hybrid cpu_experts_per_layer=2 routing=synthetic gpu_memory=16GiB
kv_tokens=8192`) the wait for the CPU's experts is inside `_combine_norm` in a decode step
(its launch spins on the bell's answer; the gap before it while the stream waited, until
2026-12-04 16:00 UTC, and before `_share_finish` until 14:00).

Two settings are the script's own: `model=` (default random:qwen3-30b-a3b) and
`quotas=6.5,5,8` (with a fixed share, `cpu_experts_per_layer=N`: one profile per quota, set
between steps in the same process, quarters of an expert allowed; `13/16`: that share of
each layer's own misses, the live share's rule), e.g. Qwen3.8 at 32K:
`1 32768 model=random:qwen3.8-flash-next moe_backend=hybrid expert_cache=device
cpu_experts_per_layer=6 quotas=6.5,4,9 gpu_memory=16GiB kv_tokens=33000 max_model_len=33000`.
`KPROFILE_STEPS` sets the profiled steps (16).

`prefill=1` (the script's own) profiles prompts instead of decode steps: each "step" is a
fresh prompt of `prompt_tokens` (its own tokens: no prefix-cache hit) prefilled to its first
token, the slot pool put back as start-up left it before each (`restart_pool`), e.g. issue
15's first 512-token fp8 prompt with the CPU's prompt rule: `1 512 prefill=1
moe_backend=hybrid expert_dtype=fp8 routing=synthetic gpu_memory=16GiB kv_tokens=8448`
(KPROFILE_STEPS=4 is plenty: ~50K kernels a prompt).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("EDGEMOE_PDL", "0")  # before edgemoe reads it: see the NOTE above

from edgemoe import LLM, SamplingParams  # noqa: E402

STEPS = int(os.environ.get("KPROFILE_STEPS", 16))
# A gap longer than this is between steps (the host's sampling and scheduling); prompts'
# profiles raise it (a layer's wait for the CPU's experts can be several ms).
IDLE_MAX_US = int(os.environ.get("KPROFILE_IDLE_MAX_US", 5_000))


def device_kernels(events) -> list[object]:  # noqa: ANN001
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]


def by_stream(events) -> dict[int, list[object]]:  # noqa: ANN001
    """The kernels by the stream that ran them, the step's own stream (the most kernel time) first."""
    streams: dict[int, list[object]] = defaultdict(list)
    for e in device_kernels(events):
        streams[getattr(e, "device_resource_id", 0)].append(e)
    return dict(sorted(streams.items(), key=lambda kv: -sum(e.time_range.elapsed_us() for e in kv[1])))


def idle_before(events) -> dict[str, list[float]]:  # noqa: ANN001
    """Gaps between consecutive kernels of the step's own stream (a side stream's copies
    overlap it) summed by the name of the kernel that ended each: where the device waited
    (a memory-operation wait, an event from a side stream, a host node, the host
    launching), not counting gaps between steps. Read them for a linear graph only: a graph
    that forks (decode prefetch) replays even the step's chain over several streams
    (2026-12-06 23:21: 413 of a step's 886 kernels on the busiest)."""
    main = next(iter(by_stream(events).values()), [])
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in main)
    gaps: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for (_, end, _), (start, _, name) in zip(kernels, kernels[1:]):
        if 0 < start - end < IDLE_MAX_US:
            gaps[name][0] += start - end
            gaps[name][1] += 1
    return gaps


def device_idle_before(events) -> dict[str, list[float]]:  # noqa: ANN001
    """Gaps in which no kernel ran on any stream, summed by the kernel that started each gap's
    end: what the whole device waited on. With a forked graph (decode prefetch) the busiest
    stream's gaps (`idle_before`) may be one branch waiting for the other while the device
    is busy."""
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in device_kernels(events))
    gaps: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    reach = float("inf")
    for start, end, name in kernels:
        if 0 < start - reach < IDLE_MAX_US:
            gaps[name][0] += start - reach
            gaps[name][1] += 1
        reach = end if reach == float("inf") else max(reach, end)
    return gaps


def busy_us(events) -> float:  # noqa: ANN001
    """The time at least one kernel ran (the union over streams): with a side stream
    (decode prefetch) the kernels' sum counts overlapped time twice."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def parse_args(argv: list[str]) -> tuple[int, int, str, list[str], dict[str, object], str, bool, dict[str, str]]:
    """(batch, prompt, model, quotas, engine settings, file tag, prefill, environment) from
    the command line; `model=`, `quotas=` and `prefill=` are the script's own (not engine
    settings), and upper-case names are environment settings (`EDGEMOE_PREFETCH_PROGRAMS=64`)."""
    batch = int(argv[1]) if len(argv) > 1 else 1
    prompt = int(argv[2]) if len(argv) > 2 else 1024
    given = dict(arg.split("=", 1) for arg in argv[3:])
    tag = "".join(f"_{k}-{v}" for k, v in given.items()).replace(":", "-").replace("/", "-")
    env = {k: given.pop(k) for k in list(given) if k.isupper()}  # EDGEMOE_*=v: set before the engine is built
    model = given.pop("model", "random:qwen3-30b-a3b")
    quotas = given.pop("quotas").split(",") if "quotas" in given else []
    prefill = given.pop("prefill", "0") != "0"
    settings: dict[str, object] = {"moe_backend": "resident", "kv_tokens": 65536}
    settings.update({k: int(v) if v.isdigit() else v for k, v in given.items()})
    return batch, prompt, model, quotas, settings, tag, prefill, env


def set_quota(engine, quota: str) -> None:  # noqa: ANN001
    """A fixed CPU share's pick for the coming steps: experts a layer, quarters allowed
    ("1.5"), or a share of each layer's own misses ("13/16": the live share's rule)."""
    from edgemoe.moe.quota_levels import COUNT, FRACTION

    share = engine.runtime.executor.cpu_share
    if share is None:
        raise SystemExit("quotas= needs a fixed CPU share (moe_backend=hybrid cpu_experts_per_layer=N)")
    num, _, den = quota.partition("/")
    scale = FRACTION if den else COUNT
    level = round(scale.per_unit * float(num) / (int(den) if den else 1))
    share.quota.copy_(torch.tensor(scale.rows(level, share.quota.shape[0], share.num_experts), dtype=torch.int64))
    share.fraction.fill_(scale.fraction(level))


def cpu_busy(engine) -> tuple[float, int]:  # noqa: ANN001
    """(seconds the CPU share's calls ran, calls) so far."""
    moe = engine.stats()["moe"] if hasattr(engine, "stats") else {}
    return float(moe.get("cpu_seconds", 0.0)), int(moe.get("cpu_calls", 0))


def profile_steps(engine) -> tuple[object, float, dict[str, float]]:  # noqa: ANN001
    """STEPS profiled steps: (the profiler, wall µs a step, the CPU share's busy time)."""
    for _ in range(8):  # warm: graphs of a new quota's shape replayed, caches settled
        engine.step()
    torch.cuda.synchronize()
    cpu0, calls0 = cpu_busy(engine)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        began = time.perf_counter()
        for _ in range(STEPS):
            engine.step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - began) * 1e6 / STEPS
    cpu1, calls1 = cpu_busy(engine)
    cpu = {"cpu_busy_us_per_step": (cpu1 - cpu0) * 1e6 / STEPS, "cpu_calls_per_step": (calls1 - calls0) / STEPS}
    return prof, wall_us, cpu


class Recorded:
    """The events of a scheduled profile's active steps, collected as each cycle ends (the
    profiler clears them then): `events()` all of them (the kernel table), `cycles()` one
    list a cycle (each cycle's clock starts anew: spans and gaps are a cycle's own)."""

    def __init__(self) -> None:
        self.by_cycle: list[list[object]] = []

    def collect(self, prof) -> None:  # noqa: ANN001
        self.by_cycle.append(list(prof.events()))

    def events(self) -> list[object]:
        return [e for cycle in self.by_cycle for e in cycle]

    def cycles(self) -> list[list[object]]:
        return self.by_cycle


def profile_prompts(engine, prompt: int) -> tuple[object, float, dict[str, float]]:  # noqa: ANN001
    """Like `profile_steps`, a step being a fresh prompt prefilled to its first token, each
    meeting the start-up pool (2 warm prompts first). The pool's restart (its preload's
    copies) runs in the profiler's warm-up steps: recorded, then dropped."""
    from torch.profiler import schedule

    from edgemoe.moe.slot_preload import restart_pool

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def restart() -> None:
        restart_pool(engine.runtime.executor)
        torch.cuda.synchronize()

    def prefill(i: int) -> float:
        """Seconds to prompt i's first token."""
        began = time.perf_counter()
        rid = engine.add_request([(5000 + 7919 * i + 31 * j) % 100_000 for j in range(prompt)], params)
        while rid in engine.requests:  # one token: finished (and dropped) at its first
            engine.step()
        torch.cuda.synchronize()
        return time.perf_counter() - began

    for i in range(2):
        restart()
        prefill(i)
    cpu0, calls0 = cpu_busy(engine)
    recorded, wall = Recorded(), 0.0
    with profile(activities=[ProfilerActivity.CUDA], schedule=schedule(wait=0, warmup=1, active=1, repeat=STEPS),
                 on_trace_ready=recorded.collect) as prof:
        for i in range(STEPS):
            restart()
            prof.step()
            wall += prefill(2 + i)
            prof.step()
    cpu1, calls1 = cpu_busy(engine)
    cpu = {"cpu_busy_us_per_step": (cpu1 - cpu0) * 1e6 / STEPS, "cpu_calls_per_step": (calls1 - calls0) / STEPS}
    return recorded, wall * 1e6 / STEPS, cpu


def stream_table(cycles) -> list[dict[str, object]]:  # noqa: ANN001
    """The step's stream's kernel time a step, then the other streams' together (a side
    stream's copies, which a CUDA graph's replay spreads over streams of its own: one a
    branch) with their top kernels' mean µs a call; printed."""
    acc: list[dict[str, list[float]]] = [defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0])]
    streams = [0, 0]
    for cycle in cycles:
        split = list(by_stream(cycle).values())
        streams[1] = max(streams[1], len(split) - 1)
        for i, kernels in enumerate(split):
            for e in kernels:
                acc[min(i, 1)][e.name][0] += e.time_range.elapsed_us()
                acc[min(i, 1)][e.name][1] += 1
    table = []
    for i, names in enumerate(acc):
        if not names:
            continue
        us, calls = sum(t for t, _ in names.values()), sum(c for _, c in names.values())
        top = sorted(names.items(), key=lambda kv: -kv[1][0])[:3]
        kernels = [{"kernel": n, "us_per_step": t / STEPS, "us_per_call": t / c} for n, (t, c) in top]
        label = "the step's stream" if i == 0 else f"{streams[1]} other streams"
        print(f"{label}: {us / STEPS:.0f} µs of kernels a step in {calls / STEPS:.1f} calls; " + ", ".join(
            f"{k['kernel'][:40]} {k['us_per_call']:.1f} µs a call" for k in kernels))
        table.append({"streams": label, "us_per_step": us / STEPS, "calls_per_step": calls / STEPS, "top": kernels})
    return table


def report(prof, wall_us: float, cpu: dict[str, float], label: str) -> dict[str, object]:  # noqa: ANN001
    """Print the kernel table and the idle gaps; the JSON record of one profile."""
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name][0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            per_kernel[e.name][1] += 1
    total = sum(t for t, _ in per_kernel.values())
    rows = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])
    cycles = prof.cycles() if hasattr(prof, "cycles") else [prof.events()]
    gaps, device_gaps = summed_gaps(cycles, idle_before), summed_gaps(cycles, device_idle_before)
    busy = sum(busy_us(cycle) for cycle in cycles) / STEPS
    print(f"{label}: {total / STEPS:.0f} µs of kernels per step, {busy:.0f} µs with a kernel "
          f"running (streams overlapped: {total / STEPS - busy:.0f}), {wall_us:.0f} µs a step by the clock (profiled); "
          f"CPU share {cpu['cpu_busy_us_per_step']:.0f} µs busy in {cpu['cpu_calls_per_step']:.1f} calls a step")
    print(f"{'µs/step':>9} {'share':>6} {'calls':>6}  kernel")
    table = []
    for name, (us, calls) in rows[:40]:
        print(f"{us / STEPS:9.1f} {100 * us / total:5.1f}% {calls / STEPS:6.1f}  {name[:110]}")
        table.append({"kernel": name, "us_per_step": us / STEPS, "share": us / total, "calls_per_step": calls / STEPS})
    streams = stream_table(cycles)
    span = print_gaps("with the busiest stream idle", gaps)
    device_span = print_gaps("with no kernel running on any stream", device_gaps)
    return {"label": label, "steps": STEPS, "us_per_step": total / STEPS, "busy_us_per_step": busy,
            "wall_us_per_step": wall_us, **cpu, "kernels": table, "streams": streams, "idle_us_per_step": span / STEPS,
            "idle_before": gap_table(gaps), "device_idle_us_per_step": device_span / STEPS,
            "device_idle_before": gap_table(device_gaps)}


def summed_gaps(cycles, gaps_of) -> dict[str, list[float]]:  # noqa: ANN001
    """`gaps_of` (idle_before, device_idle_before) over every cycle: {next kernel: [µs, gaps]}."""
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for cycle in cycles:
        for name, (us, calls) in gaps_of(cycle).items():
            total[name][0] += us
            total[name][1] += calls
    return total


def print_gaps(what: str, gaps: dict[str, list[float]]) -> float:
    """Prints a gap table by the kernel that ran next; returns its µs over the profile."""
    span = sum(g for g, _ in gaps.values())
    print(f"{span / STEPS:.0f} µs a step {what}, by the kernel that ran next "
          "(the CPU share's decode wait is inside `_combine_norm`):")
    for name, (us, calls) in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"{us / STEPS:9.1f} {calls / STEPS:6.1f}  {name[:110]}")
    return span


def gap_table(gaps: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {name: {"us_per_step": us / STEPS, "calls_per_step": calls / STEPS} for name, (us, calls) in
            sorted(gaps.items(), key=lambda kv: -kv[1][0])[:40]}


def main() -> int:
    batch, prompt, model, quotas, settings, tag, prefill, env = parse_args(sys.argv)
    os.environ.update(env)
    records = []
    with LLM(model, **settings) as llm:
        engine = llm.engine
        if prefill:
            records.append({"prefill": True, **report(*profile_prompts(engine, prompt), f"prompts of {prompt} tokens")})
        else:
            records.extend(decode_profiles(engine, batch, prompt, quotas))
    out = Path(os.environ.get("OUT", "bench/results"))
    out.mkdir(parents=True, exist_ok=True)
    record = {"batch": batch, "prompt_tokens": prompt, "model": model, "settings": settings}
    if len(records) == 1:
        record |= records[0]
    else:
        record["profiles"] = records
    (out / f"kernel_profile_b{batch}_p{prompt}{tag}.json").write_text(json.dumps(record, indent=1))
    return 0


def decode_profiles(engine, batch: int, prompt: int, quotas: list[str]) -> list[dict[str, object]]:  # noqa: ANN001
    """`batch` requests prefilled, then a decode profile per quota (one without quotas)."""
    records = []
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    ids = [engine.add_request([1000 + i + 7 * j for j in range(prompt)], params) for i in range(batch)]
    while not all(engine.requests[i].output_ids for i in ids):  # prefill; profile_steps warms the decode steps
        engine.step()
    for quota in quotas or [None]:
        if quota is not None:
            set_quota(engine, quota)
        label = f"batch {batch}, prompt {prompt}" + (f", CPU quota {quota}" if quota is not None else "")
        records.append({"quota": quota, **report(*profile_steps(engine), label)})
    return records


if __name__ == "__main__":
    raise SystemExit(main())
