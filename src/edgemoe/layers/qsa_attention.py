"""Indexed gated attention (Qwen3.8-Flash-Next's attention layers): gated attention whose
queries attend only to the tokens a QSA indexer selects (`kernels/qsa.py`).

The indexer projects x to `Hi` query heads and one key head of `Di` dims; the queries get
a zero-centred RMSNorm and the model's (partial) rotary at their positions, the raw keys
go to the KV pool's `index_k` at the tokens' slots, and a token that completes a block of
`ratio` tokens replaces its raw key by the block key (mean, norm, rotary at the block's
first position). Each query then keeps its top budget/ratio blocks plus its incomplete
tail and attends to those tokens with the layer's q/k/v (K/V written by the backend).

Decode tokens (the batch's leading ones, one per sequence) run the fixed-shape form over
every block the page table can hold (no host reads: a CUDA graph holds it, and a decode
token's result does not depend on the step's company); prompt chunks run per sequence in
query tiles sized to bound the gathered keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.qsa import (
    attend_selected,
    attend_selected_decode,
    block_keys,
    compress_blocks,
    select_blocks,
    select_decode_blocks,
)
from edgemoe.kernels.rotary import apply_rope
from edgemoe.layers.attention_backend import AttentionSpec, RopeTable
from edgemoe.layers.batch import BatchMode, ForwardBatch
from edgemoe.layers.context import StepContext
from edgemoe.layers.gated_attention import GatedAttention
from edgemoe.layers.norm import OffsetRMSNorm

TILE_BYTES = 1 << 28  # gathered K/V and block scores per prompt query tile (256 MiB)


@dataclass(frozen=True)
class QsaSpec:
    num_heads: int  # Hi
    head_dim: int  # Di
    ratio: int  # tokens per block
    block_topk: int  # budget / ratio


def rope_at(table: RopeTable, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, R] in `dtype` from the fp32 half tables, as `Rotary.cos_sin` computes them."""
    c, s = table.cos[positions], table.sin[positions]
    return torch.cat([c, c], dim=-1).to(dtype), torch.cat([s, s], dim=-1).to(dtype)


def token_rows(batch: ForwardBatch) -> torch.Tensor:
    """[T] the page-table row of each token (device ops, no sync)."""
    lens = batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]
    return torch.repeat_interleave(batch.req_rows, lens, output_size=batch.num_tokens)


class QsaAttention(GatedAttention):
    def __init__(
        self,
        spec: AttentionSpec,  # spec.rope: the rotary table by position (the indexer rotates with it)
        qkv: torch.Tensor,
        o_proj: torch.Tensor,
        q_norm: OffsetRMSNorm,
        k_norm: OffsetRMSNorm,
        qsa: QsaSpec,
        idx_qk: torch.Tensor,  # [(Hi + 1) Di, H]: query heads, then the key head
        idx_q_norm: OffsetRMSNorm,
        idx_k_norm: OffsetRMSNorm,
        linear: Linear = dense_gemv_ref,  # the projections' kernel (--dense-kernel): q/k/v, o and the indexer's
    ) -> None:
        super().__init__(spec, qkv, o_proj, q_norm, k_norm, linear)
        assert spec.rope is not None, "QSA rotates its queries and block keys from the spec's rotary table"
        self.qsa, self.idx_qk, self.idx_q_norm, self.idx_k_norm = qsa, idx_qk, idx_q_norm, idx_k_norm

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        q, gate = self.project_and_write(x, cos, sin, ctx)
        qi = self._index(x, ctx)
        return self.output(self._attend(q, qi, ctx), gate)

    def _index(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Indexer queries [T, Hi, Di] (normed, rotated); this step's keys and blocks written."""
        b, a, T = ctx.batch, self.qsa, x.shape[0]
        rope = self.spec.rope
        assert rope is not None
        qi, ki = self.linear(x, self.idx_qk).split([a.num_heads * a.head_dim, a.head_dim], -1)
        qi = apply_rope(self.idx_q_norm(qi.reshape(T, a.num_heads, a.head_dim)), *rope_at(rope, b.positions, x.dtype))
        index_k = self._index_keys(ctx)
        index_k[b.out_loc] = ki
        starts = (b.positions - (a.ratio - 1)).clamp(min=0)
        compress_blocks(index_k, b.positions, b.out_loc, token_rows(b), b.page_table, b.page_size, a.ratio,
                        self.idx_k_norm, *rope_at(rope, starts, x.dtype))
        return qi

    def _index_keys(self, ctx: StepContext) -> torch.Tensor:
        index_k = ctx.attention.pool.index_k
        assert index_k is not None, "a QSA model needs a KV pool with index keys (KVPool index_dim)"
        return index_k[self.spec.layer]

    def _attend(self, q: torch.Tensor, qi: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        b, h = ctx.batch, ctx.batch.host
        nd = len(h.q_lens) if b.mode is BatchMode.DECODE else h.num_decode
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self._attend_decode(q[:nd], qi[:nd], ctx, nd)
        for i in range(nd, len(h.q_lens)):
            start, n = h.q_starts[i], h.q_lens[i]
            out[start : start + n] = self._attend_chunk(q[start : start + n], qi[start : start + n], ctx, i)
        return out

    def _attend_decode(self, q: torch.Tensor, qi: torch.Tensor, ctx: StepContext, nd: int) -> torch.Tensor:
        """One query per sequence, over every block the page table can hold (fixed shapes)."""
        b, a, s = ctx.batch, self.qsa, self.spec
        rows, pos = b.req_rows[:nd], b.positions[:nd]
        capacity = b.page_table.shape[1] * b.page_size
        blocks, valid = select_decode_blocks(qi, self._index_keys(ctx), b.page_table, rows, (pos + 1) // a.ratio,
                                             capacity // a.ratio, b.page_size, a.ratio, a.block_topk)
        pool = ctx.attention.pool
        return attend_selected_decode(q, pos, rows, blocks, valid, pool.k[s.layer], pool.v[s.layer], b.page_table,
                                      b.page_size, a.ratio, s.scale, *pool.scales(s.layer))

    def _attend_chunk(self, q: torch.Tensor, qi: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        """Sequence i's prompt chunk, its blocks gathered once, queries in tiles."""
        b, a, s, h = ctx.batch, self.qsa, self.spec, ctx.batch.host
        n, seq_len, row = q.shape[0], h.seq_lens[i], b.req_rows[i : i + 1]
        keys = block_keys(self._index_keys(ctx), b.page_table, row, seq_len // a.ratio, b.page_size, a.ratio)
        start = h.q_starts[i]
        pos = b.positions[start : start + n]
        per_query = (a.block_topk * a.ratio + a.ratio) * 2 * s.num_kv_heads * s.head_dim * q.element_size() + \
            4 * (seq_len // a.ratio + 1) * (a.num_heads + 1)
        tile = max(1, TILE_BYTES // per_query)
        pool, out = ctx.attention.pool, torch.empty_like(q)
        for t in range(0, n, tile):
            sl = slice(t, min(n, t + tile))
            blocks, valid = select_blocks(qi[sl], keys, (pos[sl] + 1) // a.ratio, a.block_topk)
            out[sl] = attend_selected(q[sl], pos[sl], row.expand(blocks.shape[0]), blocks, valid, pool.k[s.layer],
                                      pool.v[s.layer], b.page_table, b.page_size, a.ratio, s.scale,
                                      *pool.scales(s.layer))
        return out
