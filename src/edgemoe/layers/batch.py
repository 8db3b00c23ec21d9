"""ForwardBatch: everything one forward pass needs to know about the batch.

Tokens of all sequences are flattened into one [T] axis (varlen): sequence b owns rows
cu_seqlens_q[b]:cu_seqlens_q[b + 1]. The device tensors are views into static buffers
the engine fills once per step (engine/batch_buffers.py), so kernels and CUDA graphs
see fixed addresses; `host` carries the same metadata as Python ints, so nothing in the
forward pass reads a device tensor back to decide what to launch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class BatchMode(enum.Enum):
    DECODE = "decode"  # every sequence adds exactly one token
    PREFILL = "prefill"  # every sequence adds a chunk of its prompt
    MIXED = "mixed"  # both in one step


@dataclass(frozen=True)
class BatchHost:
    """Host copies of the per-sequence metadata (read freely; no device sync)."""

    q_lens: tuple[int, ...]  # new tokens per sequence
    seq_lens: tuple[int, ...]  # context length per sequence, this step's tokens included
    req_rows: tuple[int, ...]  # page-table row per sequence
    num_decode: int = 0  # leading sequences that decode one token (the scheduler puts them first)
    num_padding: int = 0  # trailing sequences that only pad the batch to a captured size

    @property
    def q_starts(self) -> tuple[int, ...]:
        starts, acc = [], 0
        for n in self.q_lens:
            starts.append(acc)
            acc += n
        return tuple(starts)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens, default=0)


@dataclass(frozen=True)
class ForwardBatch:
    """One step's batch. Device tensors (views into static buffers):

    input_ids [T] long, positions [T] long, out_loc [T] long (the KV slot each token's
    k/v is written to), req_rows [B] int32, seq_lens [B] int32, cu_seqlens_q [B+1]
    int32, logits_indices [N] long (rows whose logits are wanted), sample_rows [N]
    int32 (the page-table row of each sampled sequence, in logits order; empty when
    scoring). `page_table` is the whole device table [R, max_pages] int32
    (cache/page_table.py), indexed by req_rows.
    """

    mode: BatchMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    req_rows: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    logits_indices: torch.Tensor
    sample_rows: torch.Tensor
    page_table: torch.Tensor
    page_size: int
    host: BatchHost

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.host.q_lens)
