"""Batched paged attention over the KV pool: decode (one query per sequence) and
extend (prefill / chunked prefill: new tokens attend to the cached prefix and causally
to each other). The batch-level form of `attention.py`'s per-sequence reference.

Layouts (one layer): k_cache, v_cache [num_slots, Hkv, D], slot = page * page_size +
offset; page_table [R, max_pages] int32 (row r: the pages of the request in row r);
req_rows [B] int32; seq_lens [B] int32, each sequence's context length *including*
this step's tokens; cu_seqlens_q [B+1] int32 (extend: sequence b's new tokens are rows
cu[b]:cu[b+1] of q). Query i of sequence b sits at position seq_lens[b] - q_len_b + i
and attends to positions <= its own, and > pos - window when `window` is given.
Softmax in fp32. GQA: query head h reads kv head h // (Hq / Hkv).
An fp8 cache (`--kv-cache-dtype fp8`) passes `k_scale`, `v_scale` [num_slots, Hkv] fp32:
the references dequantise the gathered context; the Triton kernels read the e4m3 values
directly and fold the scales into the scores and the probabilities.
Attention sinks (gpt-oss): `sinks` [Hq] fp32 on q's device, query head h's logit s_h in
each row's softmax denominator, no value (`attention.paged_attention_ref`); None: none.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.attention import paged_attention_ref
from edgemoe.kernels.backend import use_triton


def context_slots(page_table: torch.Tensor, row: int, ctx_len: int, page_size: int) -> torch.Tensor:
    """[ctx_len] int64 KV slots of positions 0..ctx_len-1 of the request in `row`."""
    pos = torch.arange(ctx_len, device=page_table.device)
    return page_table[row, pos // page_size].long() * page_size + pos % page_size


def decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    window: int | None,
    out: torch.Tensor,  # [B, Hq, D], written
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference: each sequence through `paged_attention_ref` (host syncs).
    `max_seq_len` (>= every seq_len, e.g. the engine's context limit) bounds the fast
    path's grid and workspace instead of the page table's capacity; unused here."""
    for b, (row, ctx) in enumerate(zip(req_rows.tolist(), seq_lens.tolist(), strict=True)):
        slots = context_slots(page_table, row, ctx, page_size)
        out[b] = paged_attention_ref(q[b : b + 1], k_cache, v_cache, 0, 1, slots, scale, window, k_scale, v_scale,
                                     sinks)[0]
    return out


def extend_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    req_rows: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    window: int | None,
    max_q_len: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    """Torch reference: each sequence through `paged_attention_ref` (host syncs).
    `max_q_len` (the longest q_len in the batch) sizes the fast path's grid; unused here."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for b, (row, ctx) in enumerate(zip(req_rows.tolist(), seq_lens.tolist(), strict=True)):
        start, q_len = cu[b], cu[b + 1] - cu[b]
        if q_len == 0:
            continue
        slots = context_slots(page_table, row, ctx, page_size)
        out[start : start + q_len] = paged_attention_ref(
            q, k_cache, v_cache, start, q_len, slots, scale, window, k_scale, v_scale, sinks
        )
    return out


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int, scale: float, window: int | None,
    out: torch.Tensor, max_seq_len: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `decode_attention_ref`. On CUDA, two launches: split-K over
    `attn_decode_tiles.SPLITS` splits of each sequence's own context (one program per sequence x kv head
    x split, all query heads of the group at once), then one program per (sequence, query
    head) merges them by log-sum-exp in ascending order, starting from the sink; no host sync."""
    args = (q, k_cache, v_cache, page_table, req_rows, seq_lens, page_size, scale, window, out, max_seq_len,
            k_scale, v_scale, sinks)
    if not use_triton(q):
        return decode_attention_ref(*args)
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    return decode_attention_triton(*args)


def extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
    scale: float, window: int | None, max_q_len: int, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `extend_attention_ref`. On CUDA: flash-attention tiles per
    (query block, sequence, query head), keys gathered through the page table."""
    args = (q, k_cache, v_cache, page_table, req_rows, cu_seqlens_q, seq_lens, page_size, scale, window, max_q_len,
            k_scale, v_scale, sinks)
    if not use_triton(q):
        return extend_attention_ref(*args)
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    return extend_attention_triton(*args)
