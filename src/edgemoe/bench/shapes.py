"""What `edgemoe bench decode`'s shapes need from the engine it built, checked before its
runs: a refusal naming the flags, rather than an engine error after the load (a prompt past
the context) or hours of a batch the scheduler cannot run at once."""

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
