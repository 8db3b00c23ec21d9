"""StepContext: the per-step state a forward pass reads, passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from edgemoe.cache.state_pool import StatePool
from edgemoe.layers.attention_backend import AttentionBackend
from edgemoe.layers.batch import ForwardBatch
from edgemoe.profiling import DISABLED, StepProfiler


@dataclass(frozen=True)
class StateStep:
    """A step's view of the GDN state pool (hybrid models), built once per step and read
    by every GDN layer. Device tensors only; `decode` comes from the batch's host copy."""

    pool: StatePool
    rows: torch.Tensor  # [B] int32: each sequence's state row (its page-table row)
    has_initial_state: torch.Tensor  # [B] bool: the sequence has tokens before this step's
    cu_seqlens: torch.Tensor  # [B+1] int32
    decode: bool  # every sequence adds exactly one token: the one-token kernel forms
    num_decode: int = 0  # leading sequences that decode one token (the rest: prompt chunks)

    @classmethod
    def prepare(cls, pool: StatePool, batch: ForwardBatch) -> StateStep:
        """Device ops only (no sync): a sequence continues a state when its context is
        longer than this step's tokens (a chunk that starts at position > 0)."""
        q_lens = batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]
        return cls(
            pool=pool, rows=batch.req_rows, has_initial_state=batch.seq_lens > q_lens,
            cu_seqlens=batch.cu_seqlens_q, decode=batch.host.max_q_len == 1, num_decode=batch.host.num_decode,
        )


@dataclass(frozen=True)
class StepContext:
    batch: ForwardBatch
    attention: AttentionBackend  # prepared for `batch`
    profiler: StepProfiler = DISABLED
    state: StateStep | None = None  # hybrid models: the GDN state rows of this step
    ple: Any = None  # Qwen3.8-Flash-Next: the step's PLE rows (`layers/ple.PleRows`), set by the model's step hook
