"""The Triton attention backend: a layer's per-head q/k norms (Qwen3), rotary and the KV
write in one kernel by position, paged decode attention (split over long contexts, every
split of the table's capacity in the grid so the launch is the same every step and a
CUDA graph can hold it), and flash-style extend attention for prompt chunks
(kernels/paged_attention.py). An fp8 pool (`--kv-cache-dtype fp8`) hands every kernel
its scales: writes quantise, reads fold them in. A layer's sinks (`spec.sinks`, a fixed
tensor like its window a fixed int) go to both kernels: the captured decode holds them.
"""

from __future__ import annotations

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels.attention import write_kv_ref
from edgemoe.kernels.paged_attention import decode_attention, extend_attention
from edgemoe.kernels.rope_kv import rope_write_kv
from edgemoe.layers.attention_backend import AttentionBackend, AttentionSpec
from edgemoe.layers.batch import BatchMode, ForwardBatch


class TritonPagedAttention(AttentionBackend):
    needs_step_rope = False
    graph_safe = True

    def __init__(self, pool: KVPool, device: torch.device) -> None:
        super().__init__(pool)
        self.device = device

    def write_kv(self, spec: AttentionSpec, k: torch.Tensor, v: torch.Tensor | None, batch: ForwardBatch) -> None:
        write_kv_ref(self.pool.k[spec.layer], self.pool.v[spec.layer], k, v, batch.out_loc, *self.pool.scales(spec.layer))

    def rotate_and_write(self, spec, q, k, v, cos, sin, batch, norms=None):  # type: ignore[override]
        """Head norms, rotary by position and the KV write in one kernel (norms that are not
        plain RMSNorms run first, as separate ops)."""
        if spec.rope is None:
            raise ValueError(f"layer {spec.layer}: the triton attention backend needs the rotary table in its spec")
        fused: dict[str, object] = {}
        if norms is not None and norms.fusable:
            fused = {"q_norm_w": norms.q.weight, "k_norm_w": norms.k.weight, "norm_eps": norms.q.eps}
        elif norms is not None:
            q, k = norms.q(q), norms.k(k)
        return rope_write_kv(
            q, k, v, batch.positions, spec.rope.cos, spec.rope.sin,
            self.pool.k[spec.layer], self.pool.v[spec.layer], batch.out_loc, *self.pool.scales(spec.layer),
            **fused,  # type: ignore[arg-type]
        )

    def attend(self, spec: AttentionSpec, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.pool.k[spec.layer], self.pool.v[spec.layer]
        k_scale, v_scale = self.pool.scales(spec.layer)
        if batch.mode is BatchMode.DECODE:
            out = torch.empty_like(q)
            # NOTE: the grid covers the table's whole capacity (blocks past a sequence's
            # end exit at once): the launch never depends on this step's lengths.
            capacity = batch.page_table.shape[1] * batch.page_size
            decode_attention(
                q, k_cache, v_cache, batch.page_table, batch.req_rows, batch.seq_lens, batch.page_size,
                spec.scale, spec.window, out, max_seq_len=capacity, k_scale=k_scale, v_scale=v_scale,
                sinks=spec.sinks,
            )
            return out
        return extend_attention(
            q, k_cache, v_cache, batch.page_table, batch.req_rows, batch.cu_seqlens_q, batch.seq_lens,
            batch.page_size, spec.scale, spec.window, batch.host.max_q_len, k_scale, v_scale, spec.sinks,
        )
