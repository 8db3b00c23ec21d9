"""Greedy tokens of a saved checkpoint through one executor: every model family's check that
the slot-addressed backends (experts copied into a few slots, computed on the CPU, prompts
prefilled in chunks) give the resident executor's tokens."""

from __future__ import annotations

from pathlib import Path

from edgemoe import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
# The settings each family runs against resident: 3 slots, and 4 with half the misses on the CPU.
OFFLOAD_AND_HYBRID = [
    dict(moe_backend="offload", moe_slots=3),
    dict(moe_backend="hybrid", moe_slots=4, moe_hybrid_fraction=0.5),
]


def prompts(seq: list[int]) -> list[list[int]]:
    """A short prompt and the whole sequence (longer than a chunk of 11: chunked prefill)."""
    return [seq[:6], seq]


def resident(path: Path, seq: list[int]) -> list[list[int]]:
    """The resident executor's greedy tokens (fp32)."""
    return backend(path, seq, moe_backend="resident")[0]


def backend(path: Path, seq: list[int], **settings: object) -> tuple[list[list[int]], list[float]]:
    """(greedy tokens, misses a token by layer) through `settings`, prompts prefilled in
    chunks of 11 tokens (fp32)."""
    with LLM(str(path), dtype="float32", max_prefill_tokens=11, **settings) as llm:
        tokens = [o.token_ids for o in llm.generate(prompts(seq), GREEDY)]
        return tokens, llm.stats()["moe"]["misses_per_token_by_layer"]
