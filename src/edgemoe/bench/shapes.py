"""What `edgemoe bench decode`'s shapes need from the engine it built, checked before its
runs: a refusal naming the flags, rather than an engine error after the load (a prompt past
the context) or hours of a batch the scheduler cannot run at once; and the runs whose
requests' KV the cache cannot hold at once skipped, each said (the scheduler would run such
a batch as a smaller one, and its row would name a batch it never ran)."""

from __future__ import annotations

from typing import Any


def check_shapes(runtime: Any, prompt_tokens: list[int], batch_sizes: list[int], decode_tokens: int) -> None:
    """`runtime`: the engine's (`scheduler.max_running_requests`, `max_model_len`)."""
    running = runtime.scheduler.max_running_requests
    if (big := max(batch_sizes)) > running:
        raise ValueError(f"--batch-sizes {big}: the engine runs at most {running} requests at once "
                         "(--max-running-requests)")
    if (longest := max(prompt_tokens) + decode_tokens + 1) > runtime.max_model_len:
        raise ValueError(f"--prompt-tokens {max(prompt_tokens)} with --decode-tokens {decode_tokens}: {longest} tokens, "
                         f"past the context length {runtime.max_model_len} (--max-model-len)")


def runs_that_fit(runtime: Any, prompt_tokens: list[int], batch_sizes: list[int],
                  decode_tokens: int) -> tuple[list[tuple[int, int]], list[dict[str, int]]]:
    """(the (prompt, batch) runs whose requests fit the KV cache together, the skipped ones
    with what they needed); `runtime.pool`: the KV pages (`num_pages`, `page_size`). No run
    fitting is a refusal naming --kv-tokens."""
    pages, page = runtime.pool.num_pages, runtime.pool.page_size
    runs: list[tuple[int, int]] = []
    skipped: list[dict[str, int]] = []
    for n in prompt_tokens:
        need = -(-(n + decode_tokens) // page)  # a request's pages: its prompt and its decode
        for b in batch_sizes:
            if b * need <= pages:
                runs.append((n, b))
                continue
            skipped.append({"prompt_tokens": n, "batch": b, "kv_tokens_needed": b * need * page,
                            "kv_tokens": pages * page})
            print(f"skipped prompt {n} x batch {b}: its {b * need * page} tokens of KV exceed the cache's "
                  f"{pages * page} (--kv-tokens); the engine would run it as a smaller batch")
    if not runs:
        raise ValueError(f"--kv-tokens: no run fits the KV cache's {pages * page} tokens (the smallest needs "
                         f"{min(s['kv_tokens_needed'] for s in skipped)}): raise --kv-tokens or --gpu-memory, "
                         "or lower --batch-sizes / --prompt-tokens / --decode-tokens")
    return runs, skipped
