"""`edgemoe bench decode`: prefill and decode throughput of the in-process engine.

For each prompt length: prefill tok/s of one prompt (time to the first token), then
decode tok/s at each batch size (ignore_eos, fixed output length, greedy).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from edgemoe.bench.results import plot_lines, write_result


def _random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1000, min(vocab, 150000)) for _ in range(n)]


def measure(llm: Any, prompt_tokens: int, batch: int, decode_tokens: int) -> dict[str, float]:
    from edgemoe import SamplingParams

    engine = llm.engine
    vocab = engine.vocab_size
    prompts = [_random_prompt(prompt_tokens, vocab, seed=i) for i in range(batch)]
    # Prefill: all prompts to their first token.
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts, first)
    prefill_s = time.perf_counter() - t0
    full = SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts, full)
    total_s = time.perf_counter() - t0
    decode_s = max(total_s - prefill_s, 1e-9)
    return {
        "prompt_tokens": prompt_tokens,
        "batch": batch,
        "prefill_tok_s": batch * prompt_tokens / prefill_s,
        "ttft_s": prefill_s,
        "decode_tok_s": batch * decode_tokens / decode_s,
        "decode_step_ms": 1000 * decode_s / decode_tokens,
    }


def moe_summary(stats: dict[str, Any]) -> dict[str, Any]:
    """Expert traffic over the whole run, with the effective copy bandwidth."""
    moe = stats["moe"]
    copy_gbps = moe["bytes_copied"] / moe["copy_seconds"] / 1e9 if moe["copy_seconds"] else 0.0
    return {
        "backend": stats["moe_backend"],
        "slots": stats["memory_plan"]["num_slots"],
        "hit_rate": moe["hit_rate"],
        "misses_per_token": moe["misses_per_token"],
        "gb_copied": moe["bytes_copied"] / 1e9,
        "copy_gb_per_s": copy_gbps,
        "experts_cpu": moe["experts_cpu"],
    }


def run_decode_bench(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from edgemoe import LLM

    rows = []
    with LLM(progress=True, **settings) as llm:
        measure(llm, 16, 1, 4)  # warm-up: first-call allocations and kernel selection
        for n in args.prompt_tokens:
            for b in args.batch_sizes:
                row = measure(llm, n, b, args.decode_tokens)
                rows.append(row)
                print(
                    f"prompt {n:6d} batch {b:3d}: prefill {row['prefill_tok_s']:9.1f} tok/s  "
                    f"decode {row['decode_tok_s']:8.1f} tok/s ({row['decode_step_ms']:.1f} ms/step)"
                )
        model = str(llm.engine.runtime.model_dir)
        device = str(llm.engine.runtime.device)
        moe = moe_summary(llm.stats())
    print("experts: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in moe.items()))
    path = write_result(
        args.out, "decode", {"model": model, "device": device, "settings": settings, "rows": rows, "moe": moe}
    )
    series = {f"decode b={b}": [(r["prompt_tokens"], r["decode_tok_s"]) for r in rows if r["batch"] == b] for b in args.batch_sizes}
    png = plot_lines(path, "edgemoe bench decode", "prompt tokens", "decode tok/s", series)
    print(f"wrote {path} and {png}")
    return 0
