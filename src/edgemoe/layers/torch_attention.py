"""The torch attention backend: the reference behind the AttentionBackend seam.

Each sequence's context slots are derived once per step from its page-table row on the
device (`prepare`), then attention runs sequence by sequence with the per-sequence
kernels of kernels/attention.py: `ref` (exact eager, reproduces transformers bit for
bit), `sdpa` (torch's fused kernels: no score matrix in memory) or `auto` (ref while a
sequence's score matrix is small, sdpa beyond — the CPU default, so long contexts
never materialise gigabytes of scores). Correct everywhere; fast kernels live in other
backends behind the same seam.
"""

from __future__ import annotations

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels.attention import (
    context_slots,
    paged_attention_ref,
    paged_attention_sdpa,
    write_kv_ref,
)
from edgemoe.layers.attention_backend import AttentionBackend, AttentionSpec
from edgemoe.layers.batch import ForwardBatch


class TorchPagedAttention(AttentionBackend):
    REF_MAX_SCORES = 1 << 24  # fp32 scores per sequence (64 MiB) up to which "auto" uses ref

    def __init__(self, pool: KVPool, device: torch.device, kernel: str | None = None) -> None:
        super().__init__(pool)
        kernel = kernel or ("sdpa" if device.type == "cuda" else "auto")
        if kernel not in ("ref", "sdpa", "auto"):
            raise ValueError(f"torch attention kernel {kernel!r}: choose ref, sdpa or auto")
        self.kernel_name = kernel
        self._ctx: list[torch.Tensor] = []

    def prepare(self, batch: ForwardBatch) -> None:
        h = batch.host
        self._ctx = [
            context_slots(batch.page_table[row], n, batch.page_size)
            for row, n in zip(h.req_rows, h.seq_lens, strict=True)
        ]

    def write_kv(self, spec: AttentionSpec, k: torch.Tensor, v: torch.Tensor | None, batch: ForwardBatch) -> None:
        write_kv_ref(self.pool.k[spec.layer], self.pool.v[spec.layer], k, v, batch.out_loc, *self.pool.scales(spec.layer))

    def attend(self, spec: AttentionSpec, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.pool.k[spec.layer], self.pool.v[spec.layer]
        k_scale, v_scale = self.pool.scales(spec.layer)
        out = torch.empty_like(q)
        h = batch.host
        for q_start, q_len, ctx in zip(h.q_starts, h.q_lens, self._ctx, strict=True):
            kernel = self._kernel(q.shape[1] * q_len * ctx.numel())
            out[q_start : q_start + q_len] = kernel(
                q, k_cache, v_cache, q_start, q_len, ctx, spec.scale, spec.window, k_scale, v_scale, spec.sinks
            )
        return out

    def _kernel(self, num_scores: int):  # noqa: ANN202 - a kernel function
        if self.kernel_name == "ref" or (self.kernel_name == "auto" and num_scores <= self.REF_MAX_SCORES):
            return paged_attention_ref
        return paged_attention_sdpa
