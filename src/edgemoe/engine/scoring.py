"""Scoring a prompt through the serving path: `Engine.prompt_logits`.

The prompt runs as prefill chunks of `max_prefill_tokens` on a row and pages of its own
(paged KV, the same kernels a request's prefill uses), with every position's logits
kept, then gives the row and pages back; other requests' state is untouched.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from edgemoe.config import EngineConfig
from edgemoe.engine.batch_buffers import SeqChunk
from edgemoe.engine.request import Request
from edgemoe.engine.scheduler import Scheduler
from edgemoe.messages import SamplingParams


class ScoringEngine(Protocol):
    """What scoring reads of the engine (`Engine`)."""

    config: EngineConfig
    scheduler: Scheduler
    runner: Any  # engine.runner.Runner
    runtime: Any  # engine.build.Runtime
    ple_context: int

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None: ...


def prompt_logits(engine: ScoringEngine, prompt_ids: list[int]) -> torch.Tensor:
    """Float32 logits [T, V] at every prompt position."""
    engine.validate(prompt_ids, SamplingParams())
    req = Request("score", list(prompt_ids), SamplingParams())
    table, chunk = engine.scheduler.page_table, engine.config.scheduler.max_prefill_tokens
    if table.num_free == 0 or not _reserve(engine, req, len(prompt_ids)):
        raise ValueError(f"the KV cache cannot hold {len(prompt_ids)} tokens while other requests run")
    try:
        rows = []
        ctx = engine.ple_context  # a host-hashing PLE store's n-gram context
        for start in range(0, len(prompt_ids), chunk):
            end = min(len(prompt_ids), start + chunk)
            c = SeqChunk(req.row, start, prompt_ids[start:end], req.pages, True, False, all_logits=True,  # type: ignore[arg-type]
                         context=prompt_ids[max(0, start - ctx) : start] if ctx else ())
            rows.append(engine.runner.forward([c])[1])
        return torch.cat(rows)
    finally:
        engine.runtime.pool.free(req.pages)
        table.release(req.row)  # type: ignore[arg-type]


def _reserve(engine: ScoringEngine, req: Request, num_tokens: int) -> bool:
    req.row = engine.scheduler.page_table.assign()
    if engine.scheduler.reserve(req, num_tokens):
        return True
    engine.scheduler.page_table.release(req.row)
    return False
