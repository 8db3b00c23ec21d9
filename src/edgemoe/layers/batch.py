"""ForwardBatch: everything one forward pass needs to know about the batch.

Tokens of all sequences are flattened into one [T] axis (varlen). Built by the engine
for each step, passed explicitly down to the layers; never stored globally.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqSlice:
    """One sequence's share of the step: rows [q_start, q_start + q_len) of the batch,
    attending to its first `ctx_len` positions whose KV slots are `ctx_slots` [ctx_len]."""

    q_start: int
    q_len: int
    ctx_slots: torch.Tensor

    @property
    def ctx_len(self) -> int:
        return int(self.ctx_slots.numel())


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    write_slots: torch.Tensor  # [T] long: where each token's K/V goes
    seqs: tuple[SeqSlice, ...]
    logits_indices: torch.Tensor  # [N] rows whose logits are wanted

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())
