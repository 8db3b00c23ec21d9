"""Issue 13's agent turn on the GPU machine: the time to first token of a short turn after
a long prefix the prefix cache holds, and its ratio to the copy + CPU bound.

`random:qwen3-30b-a3b` bf16, `--gpu-memory 16GiB`, `--routing synthetic`, batch 1: a
`--prefix` token prompt is prefilled once (its prefill tok/s reported), then `--turns`
prompts of the same prefix plus `--turn` new tokens each (the agent's next message) are
timed to their first token. For each turn: TTFT, the cached tokens, the experts moved
(misses) and the CPU's, the host's synthetic draws (a real router costs nothing there),
the CPU time the hypervisor stole meanwhile (a note when it set the pace, as `bench decode`'s),
and the bound: the missed experts' bytes at min(52.6 + 60, 93.8) GB/s (docs/benchmarks.md)
— the time the turn's expert traffic needs at best. Writes $OUT/turn-ttft-<backend>.json.

    OUT=... PYTHONPATH=/tmp/site:src python3 scripts/gpu_turn_ttft.py [--backend offload] [--prefix 30000] [--turn 300]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from edgemoe import LLM, SamplingParams
from edgemoe.bench.decode import draw_seconds
from edgemoe.bench.host_counters import counters_delta, disturbance, host_counters

LINK_GBPS = min(52.6 + 60.0, 93.8)  # the copy + CPU bound's bandwidth (PERF-NOTES, issue 13)


def timed(llm, prompt: list[int]) -> dict:  # noqa: ANN001
    before, draws, host, t0 = llm.stats()["moe"], draw_seconds(llm), host_counters(), time.perf_counter()
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))[0]
    seconds = time.perf_counter() - t0
    host = counters_delta(host, host_counters())
    after = llm.stats()["moe"]
    misses, cpu = after["misses"] - before["misses"], after["experts_cpu"] - before["experts_cpu"]
    return {"tokens": len(prompt), "seconds": round(seconds, 4), "cached": out.num_cached_tokens,
            "draw_s": round(draw_seconds(llm) - draws, 4), "misses": misses, "experts_cpu": cpu,
            "copied_gb": round((after["bytes_copied"] - before["bytes_copied"]) / 1e9, 3),
            "cpu_rates_ns": cpu_rates(after), "host_steal_share": round(host.get("cpu_steal_share", 0.0), 4),
            **({"host_note": note} if (note := disturbance(host)) else {})}


def cpu_rates(moe: dict) -> list[int] | None:
    """The CPU share's cost law after a request (ns an expert, ns a pair): its start-up prior
    before the first prompt chunk refits it (`moe/share_prior.py`); None without a share."""
    return [moe["cpu_ns_per_expert"], moe["cpu_ns_per_pair"]] if "cpu_ns_per_expert" in moe else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random:qwen3-30b-a3b")
    ap.add_argument("--gpu-memory", default="16GiB")
    ap.add_argument("--backend", default="offload")
    ap.add_argument("--prefix", type=int, default=30000)
    ap.add_argument("--turn", type=int, default=300)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-prefill-tokens", type=int, default=8192)
    ap.add_argument("--prompt-cpu", action=argparse.BooleanOptionalAction, default=None,
                    help="hybrid: the CPU takes the turn's sparse experts (default: the engine's, on)")
    args = ap.parse_args()
    settings = dict(model=args.model, dtype="bfloat16", gpu_memory=args.gpu_memory,
                    kv_tokens=args.prefix + args.turns * (args.turn + 8) + 256, routing="synthetic",
                    moe_backend=args.backend, max_prefill_tokens=args.max_prefill_tokens, prompt_cpu=args.prompt_cpu)
    rng = random.Random(0)
    prefix = [rng.randrange(1000, 150000) for _ in range(args.prefix)]
    rows = []
    with LLM(progress=False, **settings) as llm:
        nbytes = llm.engine.runtime.executor.slots.expert_nbytes  # the slot banks of either expert cache
        moe = llm.stats()["moe"]
        prior, probe = cpu_rates(moe), moe.get("cpu_prior_times_ns")
        print("the CPU share's start-up rates (ns an expert, a pair):", prior, "read off", probe, flush=True)
        first = timed(llm, prefix)
        first["prefill_tok_s_without_draws"] = round(args.prefix / (first["seconds"] - first["draw_s"]), 1)
        print("prefix", first, flush=True)
        for i in range(args.turns):
            turn = timed(llm, prefix + [rng.randrange(1000, 150000) for _ in range(args.turn)])
            bound_s = turn["misses"] * nbytes / (LINK_GBPS * 1e9)
            turn.update(ttft_without_draws=round(turn["seconds"] - turn["draw_s"], 4), bound_s=round(bound_s, 4),
                        bound_ratio=round(bound_s / max(1e-9, turn["seconds"] - turn["draw_s"]), 3))
            rows.append(turn)
            print("turn", i, turn, flush=True)
        plan = llm.stats()["memory_plan"]
    path = os.path.join(os.environ.get("OUT", "bench/results"), f"turn-ttft-{args.backend}{'-no-prompt-cpu' if args.prompt_cpu is False else ''}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"settings": settings, "slots": plan.get("num_slots"), "expert_bytes": nbytes,
                   "cpu_rates_prior_ns": prior, "cpu_prior_times_ns": probe, "prefix": first, "turns": rows}, f, indent=1)


if __name__ == "__main__":
    main()
