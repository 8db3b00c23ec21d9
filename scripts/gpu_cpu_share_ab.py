"""The device cache's CPU share in issue 13's scenario, one engine, settings changed between runs.

`random:qwen3-30b-a3b` bf16, `--gpu-memory 16GiB --kv-tokens 8192`, `--moe-backend hybrid
--expert-cache device`, synthetic routing, batch 1, a 1K prompt: decode tok/s, misses a
token (CPU experts included), the CPU's experts a token and its µs a call, for each quota
(the CPU's experts a layer, rewritten on the device between runs: no re-capture) with the
pick by heat (the coldest misses, the default) and by id (heat off: the last misses by
id, as before). Quota 0 is offload, bitwise. Writes $OUT/cpu-share-ab.json.

    OUT=... PYTHONPATH=/tmp/site:src python3 scripts/gpu_cpu_share_ab.py [--quotas 0 1 2 3] [--picks heat id]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from edgemoe import LLM
from edgemoe.bench.decode import measure
from edgemoe.moe.cpu_share import HEAT_UNIT


def set_gemm_ns(share, ns: int) -> None:  # noqa: ANN001
    """The prompt rule's device GEMM cost an expert (`rates[3]`), host and device alike."""
    share.rate_ns[3] = ns
    share.rates[3] = ns


def prompt_ab(llm, share, lengths: list[int], reps: int = 2, gemm_ns: list[int] | None = None) -> list[dict]:  # noqa: ANN001
    """Prefill tok/s of each length per arm — the prompt rule on and off (the share's
    prompt_rows zeroed: every miss copied), or with `gemm_ns` the rule on at each of those
    device GEMM costs an expert — in turn, the order reversed each round: every run a
    prompt of its own (a repeated one would be the prefix cache's hit) meeting the
    start-up pool (`restart_pool`: emptied and preloaded again). The CPU's experts a token,
    its busy ms, the bytes copied and the rule's rates after the run."""
    from edgemoe.moe.slot_preload import restart_pool

    out, covered, seed = [], share.prompt_rows, 1000
    arms = [(True, ns) for ns in gemm_ns] if gemm_ns else [(True, None), (False, None)]
    default_gemm = share.rate_ns[3]
    for rep in range(reps):
        for n in lengths:
            for on, ns in (arms if rep % 2 == 0 else arms[::-1]):
                share.prompt_rows = covered if on else 0
                set_gemm_ns(share, default_gemm if ns is None else ns)
                restart_pool(llm.engine.runtime.executor)
                seed += 1
                row = measure(llm, n, 1, 2, seed=seed)
                pm = row["prefill_moe"]
                if row["cached_prompt_tokens"]:
                    raise RuntimeError(f"prompt {seed} met the prefix cache ({row['cached_prompt_tokens']} tokens)")
                out.append({"round": rep, "prompt": n, "prompt_cpu": on, "gemm_ns": share.rate_ns[3],
                            "prefill_tok_s": round(row["prefill_tok_s"], 1),
                            "prefill_tok_s_without_draws": round(row.get("prefill_tok_s_without_draws", 0.0), 1),
                            "prefill_s": round(row["prefill_s"], 3), "misses_per_token": round(pm["misses_per_token"], 2),
                            "cpu_experts_per_token": round(pm["experts_cpu"] / max(1, pm["tokens"]), 2),
                            "cpu_ms": round(pm["cpu_ms_per_token"] * pm["tokens"], 1), "gb_copied": round(pm["gb_copied"], 2),
                            "copy_gb_per_s": round(pm["copy_gb_per_s"], 1), "rate_ns": list(share.rate_ns)})
                print(out[-1], flush=True)
    share.prompt_rows = covered
    set_gemm_ns(share, default_gemm)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quotas", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--picks", nargs="+", default=["heat", "id"], choices=["heat", "id"])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--gpu-memory", default="16GiB")
    ap.add_argument("--expert-dtype", default="bf16")
    ap.add_argument("--threads", type=int, default=None, help="CPU expert threads (default: physical cores - 1)")
    ap.add_argument("--prompt-ab", type=int, nargs="*", default=None,
                    help="instead: prefill of prompts of these lengths with the prompt rule on / off (--prompt-cpu)")
    ap.add_argument("--gemm-ns", type=int, nargs="+", default=None,
                    help="with --prompt-ab: the rule on at each of these device GEMM costs an expert (ns), not on / off")
    ap.add_argument("--rounds", type=int, default=2, help="with --prompt-ab: rounds of every arm and length")
    args = ap.parse_args()
    settings = dict(model="random:qwen3-30b-a3b", dtype="bfloat16", gpu_memory=args.gpu_memory, kv_tokens=8192,
                    moe_backend="hybrid", expert_cache="device", cpu_experts_per_layer=1, routing="synthetic",
                    expert_dtype=args.expert_dtype)
    if args.threads:
        os.environ["EDGEMOE_CPU_THREADS"] = str(args.threads)
    rows = []
    t0 = time.perf_counter()
    if args.prompt_ab is not None:
        settings["prompt_cpu"] = True
    with LLM(progress=False, **settings) as llm:
        print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
        share = llm.engine.runtime.executor.cpu_share
        measure(llm, 16, 1, 4, seed=0)  # warm-up, graphs
        seed = 1
        if args.prompt_ab is not None:
            measure(llm, 600, 1, 2, seed=1)  # the prompt rule's first use (its kernels' shapes)
            rows.extend(prompt_ab(llm, share, args.prompt_ab or [300, 1024, 2048], args.rounds, args.gemm_ns))
            args.picks = []
        for pick in args.picks:
            for quota in args.quotas:
                share.quota.fill_(quota)
                share.heat.zero_()
                share.heat_unit.fill_(HEAT_UNIT if pick == "heat" else 0)
                row = measure(llm, 1024, 1, args.decode_tokens, seed=seed)
                seed += 1
                moe = llm.stats()["moe"]
                out = {"pick": pick, "quota": quota, "decode_tok_s": round(row["decode_tok_s"], 2),
                       "step_ms_p50": round(row["decode_step_ms_p50"], 2),
                       "misses_per_token": round(row["decode_moe"]["misses_per_token"], 1),
                       "cpu_experts_per_token": round(row["decode_moe"]["experts_cpu"] / max(1, row["decode_moe"]["tokens"]), 1),
                       "hit_rate": round(row["decode_moe"]["hit_rate"], 3),
                       "cpu_us_per_call": moe.get("cpu_us_per_call"), "slots": llm.stats()["memory_plan"]["num_slots"]}
                rows.append(out)
                print(out, flush=True)
    name = f"cpu-share-ab-{args.expert_dtype}{'-gemm' if args.gemm_ns else ''}.json"
    path = os.path.join(os.environ.get("OUT", "bench/results"), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"settings": settings, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
