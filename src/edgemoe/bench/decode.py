"""`edgemoe bench decode`: prefill and decode throughput of the in-process engine.

One run per (prompt length, batch size): `batch` random prompts are submitted at once
(greedy, ignore_eos, `decode_tokens` tokens after the first). Two phases, timed apart:

- prefill: from submission to the first token of every request;
- decode: every engine step after that, each timestamped; decode tok/s = the tokens
  those steps produced / their time.

Every run draws its own random prompts, so no run is served from another's KV through
the prefix cache (the result reports `cached_prompt_tokens`, which should be 0). Expert
traffic is `llm.stats()["moe"]` snapshotted around each phase, reported per phase.
`prefill_phase` and `decode_phase` are separate functions so a profiler can wrap them.

With a slot cache, the decode phase's routing is recorded (`moe/routing_trace.py`) and
replayed at the run's slot count through LRU, LFU and Belady's MIN (`moe/replay.py`), and,
when the CPU computed misses, through the run's policy with the CPU share's rule (its misses
never enter the cache): `cache_replay` in each row. Under `--routing synthetic:…` every row and the file say so.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from edgemoe.bench.allocator import allocator_snapshot, allocator_traffic
from edgemoe.bench.host_counters import busy_threads, counters_delta, disturbance, host_counters, thread_ticks
from edgemoe.bench.prefetch_report import prefetch_note, prefetch_traffic
from edgemoe.bench.profile import TRACED_STEPS, format_profile, profile_decode
from edgemoe.bench.results import plot_lines, plot_stacked, write_result
from edgemoe.engine.step_anatomy import StepAnatomy, phase_totals, slow_steps
from edgemoe.moe.quota_levels import COUNT, FRACTION
from edgemoe.moe.replay import REPLAYED, compare_policies, replay_share

# Cumulative counters of `MoEStats.snapshot()`; a phase's traffic is their difference.
TRAFFIC = ("hits", "misses", "experts_cpu", "bytes_copied", "copy_seconds", "cpu_seconds", "tokens")


@dataclass
class Phase:
    """What one phase took: wall time, tokens generated, step durations, expert traffic."""

    seconds: float = 0.0
    tokens: int = 0
    step_seconds: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)  # tokens each timed step returned
    moe: dict[str, float] = field(default_factory=dict)
    cached_prompt_tokens: int = 0  # prompt tokens the prefix cache served (prefill)
    allocator: dict[str, Any] = field(default_factory=dict)  # bench/allocator.py ({} on a CPU)
    draw_seconds: float = 0.0  # host time drawing synthetic routing (no real router's cost)
    host: dict[str, float] = field(default_factory=dict)  # the machine's counters (bench/host_counters.py)
    host_threads: list[list] = field(default_factory=list)  # [thread, share of the phase on a core], busiest first
    anatomy: StepAnatomy | None = None  # each step's host phases and collections (overlap only)


def draw_seconds(llm: Any) -> float:
    """Host seconds the synthetic routing has spent drawing (0 with the router)."""
    return float(getattr(llm.engine.runtime.executor.routing, "draw_seconds", 0.0))


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, min(vocab, 150000)) for _ in range(length)] for _ in range(batch)]


def moe_traffic(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Expert traffic between two `llm.stats()["moe"]` snapshots."""
    d = {k: after[k] - before[k] for k in TRAFFIC}
    uses = d["hits"] + d["misses"]
    return {
        "tokens": d["tokens"],
        "hit_rate": d["hits"] / uses if uses else 0.0,
        "misses_per_token": d["misses"] / d["tokens"] if d["tokens"] else 0.0,
        "gb_copied": d["bytes_copied"] / 1e9,
        "copy_gb_per_s": d["bytes_copied"] / d["copy_seconds"] / 1e9 if d["copy_seconds"] else 0.0,
        "misses": d["misses"],
        "experts_cpu": d["experts_cpu"],
        # The CPU experts' busy time: a request whose steps run slow shows here whether its CPU share did.
        "cpu_ms_per_token": 1000 * d["cpu_seconds"] / d["tokens"] if d["tokens"] else 0.0,
        **({"streamed_chunks": after["streamed_chunks"] - before["streamed_chunks"]} if "streamed_chunks" in after else {}),
        **(prefetch_traffic(before, after, d) if after.get("prefetch") else {}),
    }


def expert_read_gb_s(moe: dict[str, Any], expert_nbytes: int, seconds: float) -> float:
    """GB/s of expert weights read from host memory over a phase (`moe_traffic`'s): the
    link's copies and the CPU's experts together. Issue 13's decode at 16 GiB is bound by
    this rate (docs/benchmarks.md, "The bell inside the launches")."""
    return (moe["gb_copied"] * 1e9 + moe["experts_cpu"] * expert_nbytes) / seconds / 1e9 if seconds else 0.0


def _expert_nbytes(llm: Any) -> int:
    store = getattr(llm.engine.runtime.executor, "store", None)
    return int(store.expert_nbytes) if store is not None else 0


def prefill_phase(llm: Any, prompts: list[list[int]], params: Any) -> tuple[Phase, set[str]]:
    """Submit every prompt, then step until each has its first token (requests that
    get theirs early may decode meanwhile). Returns the phase and the request ids."""
    engine, phase = llm.engine, Phase()
    device = engine.runtime.device
    alloc, host = allocator_snapshot(device), host_counters()
    before, draws, t0 = llm.stats()["moe"], draw_seconds(llm), time.perf_counter()
    request_ids = {engine.add_request(p, params) for p in prompts}
    waiting = set(request_ids)
    while waiting:
        for out in engine.step():
            phase.tokens += len(out.token_ids)
            if out.token_ids and out.request_id in waiting:
                waiting.discard(out.request_id)
                phase.cached_prompt_tokens += out.num_cached_tokens
    phase.seconds = time.perf_counter() - t0
    phase.draw_seconds = draw_seconds(llm) - draws
    phase.moe = moe_traffic(before, llm.stats()["moe"])
    phase.allocator = allocator_traffic(device, alloc)
    phase.host = counters_delta(host, host_counters())
    return phase, request_ids


def decode_phase(llm: Any, request_ids: set[str], decode_tokens: int) -> Phase:
    """Step until every request has `decode_tokens` tokens after its first (or
    finished), timestamping each step."""
    engine, phase, running = llm.engine, Phase(), set(request_ids)
    device = engine.runtime.device
    alloc, host, threads = allocator_snapshot(device), host_counters(), thread_ticks()
    loop = engine.overlap
    if loop is not None:
        share = getattr(engine.runtime.executor, "cpu_share", None)  # its calls beside each step
        phase.anatomy = loop.anatomy = StepAnatomy(device=device.type == "cuda", cpu=share and share.busy_totals)
        phase.anatomy.start()
    before, t0 = llm.stats()["moe"], time.perf_counter()
    last = t0
    try:
        while running and len(phase.step_seconds) < decode_tokens:
            outputs = engine.step()
            now = time.perf_counter()
            phase.step_seconds.append(now - last)
            phase.step_tokens.append(sum(len(out.token_ids) for out in outputs))
            last = now
            for out in outputs:
                phase.tokens += len(out.token_ids)
                if out.finished:
                    running.discard(out.request_id)
    finally:
        if loop is not None:
            loop.anatomy = None
            phase.anatomy.stop()  # type: ignore[union-attr]
    phase.seconds = last - t0
    phase.moe = moe_traffic(before, llm.stats()["moe"])
    phase.allocator = allocator_traffic(device, alloc)
    phase.host = counters_delta(host, host_counters())
    phase.host_threads = busy_threads(threads, thread_ticks(), phase.seconds)
    return phase


def measure(
    llm: Any, prompt_tokens: int, batch: int, decode_tokens: int, seed: int, profile_steps: int = 0
) -> dict[str, Any]:
    """One run: `batch` prompts of `prompt_tokens` random tokens (drawn from `seed`),
    `decode_tokens` tokens each after the first. With `profile_steps`, that many more
    decode steps are profiled after the timed ones (`bench/profile.py`)."""
    from edgemoe import SamplingParams

    if min(prompt_tokens, batch, decode_tokens) < 1:
        raise ValueError("prompt_tokens, batch and decode_tokens must be positive")
    extra = profile_steps + TRACED_STEPS if profile_steps else 0
    # A request whose prefill ends early decodes while the others' prefill: room for those
    # steps too, so every request is still decoding in each timed (and profiled) step.
    chunk = llm.engine.runtime.scheduler.max_prefill_tokens
    prefill_steps = -(-batch * prompt_tokens // chunk) + batch
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1 + extra + prefill_steps, ignore_eos=True)
    prompts = random_prompts(batch, prompt_tokens, llm.engine.vocab_size, seed)
    prefill, request_ids = prefill_phase(llm, prompts, params)
    trace = llm.engine.runtime.trace
    trace.start()
    try:
        decode = decode_phase(llm, request_ids, decode_tokens)
    finally:
        accesses = trace.stop()
    replay = cache_replay(llm, accesses, decode.moe["hit_rate"], decode.moe["experts_cpu"], decode.moe["misses"])
    profile = profile_decode(llm, request_ids, profile_steps) if profile_steps else None
    for rid in request_ids:
        llm.engine.abort(rid)
    steps, rate = decode.step_seconds, steady_rate(decode)
    return {
        **({"profile": profile} if profile else {}),
        **({"cache_replay": replay} if replay else {}),
        "routing": llm.engine.runtime.routing,
        "prompt_tokens": prompt_tokens,
        "batch": batch,
        "decode_tokens": decode_tokens,
        "cached_prompt_tokens": prefill.cached_prompt_tokens,
        "prefill_s": prefill.seconds,
        "prefill_tok_s": batch * prompt_tokens / prefill.seconds,
        "prefill_moe": prefill.moe,
        # Synthetic routing draws each token's experts on the host before the step; the draws
        # the GPU idled for (none in flight: `SyntheticRouting.draw_seconds`) are not the
        # engine's: its own prefill rate is the time without them.
        **({"prefill_draw_s": prefill.draw_seconds,
            "prefill_tok_s_without_draws": batch * prompt_tokens / (prefill.seconds - prefill.draw_seconds)}
           if prefill.draw_seconds else {}),
        **({"prefill_allocator": prefill.allocator} if prefill.allocator else {}),
        **({"prefill_host": prefill.host} if prefill.host else {}),
        **({"prefill_host_note": note} if prefill.host and (note := disturbance(prefill.host)) else {}),
        "decode_s": decode.seconds,
        "decode_steps": len(steps),
        "decode_tokens_timed": decode.tokens,
        "decode_tok_s": rate.tokens / rate.seconds,
        "decode_step_ms": 1000 * rate.seconds / rate.steps,
        "decode_step_ms_p50": 1000 * statistics.median(steps[-rate.steps:]),
        "decode_step_ms_max": 1000 * max(steps[-rate.steps:]),
        "decode_step_ms_each": [round(1000 * t, 2) for t in steps],  # a trend (warming, settling) shows here
        # where a slow step's time went: the host's schedule / launch / complete, the collector
        **({"decode_slow_steps": slow_steps(steps, decode.anatomy), "decode_phase_ms": phase_totals(decode.anatomy)}
           if decode.anatomy is not None else {}),
        "decode_moe": decode.moe,
        "decode_expert_read_gb_s": expert_read_gb_s(decode.moe, _expert_nbytes(llm), decode.seconds),
        # a slow request's cause: cores shared (involuntary switches), steal, memory scans
        **({"decode_host": decode.host, "decode_busy_threads": decode.host_threads} if decode.host else {}),
        **({"decode_host_note": note} if decode.host and (note := disturbance(decode.host, len(steps))) else {}),
        **({"decode_allocator": decode.allocator} if decode.allocator else {}),
    }


@dataclass(frozen=True)
class SteadyRate:
    tokens: int
    seconds: float
    steps: int


def steady_rate(decode: Phase) -> SteadyRate:
    """The decode phase's rate without its first step. With overlap that step hands back a
    step launched while the prefill phase ended (its device time mostly before the phase's
    clock: timed, ~2 ms where a step takes ~16), so tokens over the whole phase's time
    counted one step of work too few (1-2% at 48-128 tokens). From the second step on, the
    returns are paced by the device's steps 2..N, and they carry N - 1 tokens a request."""
    if len(decode.step_seconds) < 2:
        return SteadyRate(decode.tokens, decode.seconds, len(decode.step_seconds))
    return SteadyRate(sum(decode.step_tokens[1:]), sum(decode.step_seconds[1:]), len(decode.step_seconds) - 1)


def cache_replay(llm: Any, accesses: list[Any], engine_hit_rate: float, experts_cpu: int = 0,
                 misses: int = 0) -> dict[str, Any] | None:
    """The policies and Belady on the decode trace at the run's slot count (None: no slot
    cache); when the CPU computed misses (`experts_cpu` of the trace's `misses`), also the
    run's policy with that share (`replay_share`, at the quota level nearest the CPU's
    experts a layer, or for a live share by each layer's misses the sixteenths nearest the
    CPU's part of them): what the share's misses that never enter the cache cost in hit rate."""
    rt = llm.engine.runtime
    if not rt.plan.num_slots or not accesses:
        return None
    arch = rt.model.arch
    out = compare_policies(accesses, rt.plan.num_slots, arch.num_layers, arch.num_experts)
    info = llm.stats()["moe"]
    if experts_cpu and info.get("expert_cache") == "device":  # the device cache's share (moe/cpu_share.py)
        by_misses = info.get("cpu_quota_unit") == FRACTION.unit  # a live share of each layer's misses
        scale = FRACTION if by_misses else COUNT
        level = round(scale.per_unit * experts_cpu / (max(misses, experts_cpu) if by_misses else len(accesses)))
        L, E = arch.num_layers, arch.num_experts
        share = replay_share(accesses, rt.plan.num_slots, L, E, scale.rows(level, L, E), info["expert_policy"],
                             fraction=scale.fraction(level))
        key = "fraction_of_misses" if by_misses else "quota_per_layer"
        out["share"] = {**share.as_dict(), key: scale.value(level)}
    # The engine's cache was warm from prefill; the replays start cold and skip the warm-up.
    return {**out, "engine_decode_hit_rate": engine_hit_rate, "routing": rt.routing}


def _print_row(row: dict[str, Any]) -> None:
    label = "" if row.get("routing", "router") == "router" else f"[{row['routing']}] "
    replay = row.get("cache_replay")
    if replay:
        rates = [f"{p} {replay[p]['hit_rate']:.3f}" for p in (*REPLAYED, "belady")
                 if p in replay and replay[p]["hit_rate"] is not None]
        share = replay.get("share", {})
        if share.get("hit_rate") is not None:
            at = (f"{share['quota_per_layer']:g}" if "quota_per_layer" in share
                  else f"{share['fraction_of_misses']:g} of the misses")
            rates.append(f"{share['policy']}@{at} {share['hit_rate']:.3f}")
        label += f"hit rates on the decode trace: {', '.join(rates) or 'pool never filled'}; "
    print(
        label + f"prompt {row['prompt_tokens']:6d} batch {row['batch']:3d}: "
        f"prefill {row['prefill_tok_s']:9.1f} tok/s ({row['prefill_s']:.3f} s{_draw_note(row)})  "
        f"decode {row['decode_tok_s']:8.1f} tok/s ({row['decode_step_ms']:.1f} ms/step)  "
        f"misses/token prefill {row['prefill_moe']['misses_per_token']:.2f}" + _cpu_note(row["prefill_moe"])
        + f" decode {row['decode_moe']['misses_per_token']:.2f}" + _cpu_note(row["decode_moe"])
        + prefetch_note(row["decode_moe"])
        + (f", {row['decode_expert_read_gb_s']:.1f} GB/s of experts read from host memory"
           if row.get("decode_expert_read_gb_s") else "")
        + _allocator_note(row.get("prefill_allocator"))
        + "".join(f"\n  {phase}: {row[f'{phase}_host_note']}" for phase in ("prefill", "decode")
                  if f"{phase}_host_note" in row)
    )


def _draw_note(row: dict[str, Any]) -> str:
    if "prefill_draw_s" not in row:
        return ""
    return f"; {row['prefill_tok_s_without_draws']:.1f} tok/s without {row['prefill_draw_s']:.3f} s of routing draws"


def _cpu_note(moe: dict[str, Any]) -> str:
    """The CPU's experts a token in a phase, when it computed any."""
    if not moe.get("experts_cpu") or not moe.get("tokens"):
        return ""
    return f" (CPU {moe['experts_cpu'] / moe['tokens']:.2f})"


def _allocator_note(alloc: dict[str, Any] | None) -> str:
    """What the allocator did in the prefill, when it did more than hand out cached blocks."""
    if not alloc or not (alloc["num_alloc_retries"] or alloc["num_device_alloc"] or alloc["num_device_free"]):
        return ""
    return (f"\n  prefill allocator: {alloc['num_alloc_retries']} retries, {alloc['num_device_alloc']} cudaMalloc, "
            f"{alloc['num_device_free']} cudaFree, reserved peak {alloc['reserved_peak_gib']:.2f} GiB")


WARMUP_CHUNK = 600  # tokens of the warm-up's prompt-sized request


def run_decode_bench(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from edgemoe import LLM
    from edgemoe.bench.shapes import check_shapes, runs_that_fit
    from edgemoe.moe.slot_preload import restart_pool

    rows = []
    t0 = time.perf_counter()
    with LLM(progress=True, **settings) as llm:
        load_s = time.perf_counter() - t0
        print(f"engine built in {load_s:.1f} s")
        check_shapes(llm.engine.runtime, args.prompt_tokens, args.batch_sizes, args.decode_tokens)
        runs, skipped = runs_that_fit(llm.engine.runtime, args.prompt_tokens, args.batch_sizes, args.decode_tokens)
        # Warm-up: first-call allocations and kernel selection, for decode steps and for a prompt
        # chunk (past a decode step's rows, below a streamed chunk: the CPU share's prompt rule).
        measure(llm, min(16, *(n for n, _ in runs)), 1, min(4, args.decode_tokens), seed=0)
        runtime = llm.engine.runtime
        if (chunk := min(WARMUP_CHUNK, runtime.max_model_len, runtime.plan.kv_tokens) - 8) > 16:
            measure(llm, chunk, 1, 2, seed=0)
        restart_pool(runtime.executor)  # the first measured prompt meets the start-up pool
        for seed, (n, b) in enumerate(runs, start=1):
            rows.append(measure(llm, n, b, args.decode_tokens, seed=seed, profile_steps=args.profile_steps if args.profile else 0))
            _print_row(rows[-1])
            if "profile" in rows[-1]:
                print(format_profile(rows[-1]["profile"]))
        stats = llm.stats()
        model, device = llm.engine.runtime.source.name, str(llm.engine.runtime.device)
        overlap = llm.engine.overlap is not None  # --overlap as resolved (default: on with a GPU)
    moe = {"backend": stats["moe_backend"], "slots": stats["memory_plan"]["num_slots"], "final": stats["moe"]}
    payload = {
        "model": model, "device": device, "routing": stats["routing"], "settings": settings, "load_s": load_s,
        "overlap": overlap, "rows": rows, "moe": moe, "skipped": skipped,
    }
    path = write_result(args.out, "decode", payload)
    series = {
        f"decode b={b}": [(r["prompt_tokens"], r["decode_tok_s"]) for r in rows if r["batch"] == b]
        for b in sorted({r["batch"] for r in rows})
    }
    title = "edgemoe bench decode" + ("" if stats["routing"] == "router" else f" ({stats['routing']})")
    png = plot_lines(path, title, "prompt tokens", "decode tok/s", series)
    print(f"wrote {path} and {png}")
    if args.profile:
        bars = {f"{r['prompt_tokens']}x{r['batch']}": _top_level(r["profile"]["regions_ms"]) for r in rows}
        print(f"wrote {plot_stacked(path, 'decode step breakdown', 'ms per step', bars)}")
    return 0


def _top_level(regions: dict[str, float]) -> dict[str, float]:
    """The regions that add up to the device span (parts like "moe/copy" excluded)."""
    skip = ("device_ms", "wall_ms")
    return {k: v for k, v in regions.items() if "/" not in k and k not in skip}
