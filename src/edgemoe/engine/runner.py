"""ModelRunner: turns a StepPlan into a ForwardBatch, runs the model, returns logits."""

from __future__ import annotations

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.engine.scheduler import ScheduledSeq
from edgemoe.layers.attention import AttentionBackend
from edgemoe.layers.batch import ForwardBatch, SeqSlice
from edgemoe.models.decoder import MoEDecoder


def build_batch(
    seqs: list[ScheduledSeq], pool: KVPool, device: torch.device, all_logits: bool = False
) -> ForwardBatch:
    """Flatten the scheduled chunks into one varlen batch.

    Logits rows: the last token of every sequence that samples (or every row when
    `all_logits`, for scoring prompts)."""
    ids: list[int] = []
    positions: list[torch.Tensor] = []
    write, slices, logit_rows = [], [], []
    for s in seqs:
        req, end = s.request, s.start + s.length
        q_start = len(ids)
        ids.extend(req.token_slice(s.start, end))
        positions.append(torch.arange(s.start, end))
        ctx = pool.slots(req.pages, 0, end)
        write.append(ctx[s.start :])
        slices.append(SeqSlice(q_start, s.length, ctx))
        if all_logits:
            logit_rows.extend(range(q_start, q_start + s.length))
        elif s.samples:
            logit_rows.append(q_start + s.length - 1)
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.cat(positions).to(device),
        write_slots=torch.cat(write),
        seqs=tuple(slices),
        logits_indices=torch.tensor(logit_rows, dtype=torch.long, device=device),
    )


class ModelRunner:
    def __init__(self, model: MoEDecoder, attention: AttentionBackend, pool: KVPool, device: torch.device):
        self.model, self.attention, self.pool, self.device = model, attention, pool, device

    def run(self, seqs: list[ScheduledSeq], all_logits: bool = False) -> torch.Tensor:
        """Forward the chunks; return float32 logits [N, V] for the logits rows."""
        batch = build_batch(seqs, self.pool, self.device, all_logits)
        hidden = self.model.forward(batch, self.attention)
        return self.model.logits(hidden)
