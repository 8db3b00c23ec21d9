"""Paged causal attention over a KV pool, torch reference.

The KV pool stores keys/values by *slot* (page * page_size + offset). A sequence's
context is gathered through its page table; its queries are the last `q_len` positions.
An fp8 pool passes its scales (`k_scale`, `v_scale` [S, Hkv]): writes quantise, and the
gathered context is dequantised to the queries' dtype (`edgemoe.quant.kv`).

Attention sinks (gpt-oss, `sinks` [Hq] fp32): query head h's learned logit s_h joins each
row's softmax denominator and contributes no value: p_j = exp(z_j) / (Σ exp(z_j) + exp(s_h)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.quant.kv import dequantise_kv, quantise_kv


def write_kv_ref(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, slots: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """k_cache/v_cache [S, Hkv, D]; k/v [T, Hkv, D]; slots [T]; scales [S, Hkv] (fp8 pools).
    `v` None: the value is the key (a pool whose V is K's tensor, `KVPool(shared_kv=True)`):
    k is written once."""
    if k_scale is None or v_scale is None:
        k_cache[slots] = k
        if v is not None:
            v_cache[slots] = v
        return
    k_cache[slots], k_scale[slots] = quantise_kv(k)
    if v is not None:
        v_cache[slots], v_scale[slots] = quantise_kv(v)


def context_slots(table_row: torch.Tensor, ctx_len: int, page_size: int) -> torch.Tensor:
    """KV slots [ctx_len] of positions 0..ctx_len-1 for a page-table row [max_pages]
    (device work only: the row stays where it is)."""
    n_pages = -(-ctx_len // page_size)
    pages = table_row[:n_pages].long()
    offsets = torch.arange(page_size, device=table_row.device)
    return (pages[:, None] * page_size + offsets[None, :]).flatten()[:ctx_len]


def causal_mask(q_len: int, ctx_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[q_len, ctx_len] bool: query i sits at position ctx_len - q_len + i."""
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=device)[:, None]
    k_pos = torch.arange(ctx_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def gather_heads(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_start: int, q_len: int, ctx_slots: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence's queries [Hq, q, D] and its context keys/values [Hkv, C, D] (in q's
    dtype: an fp8 cache is dequantised)."""
    qs = q[q_start : q_start + q_len].transpose(0, 1)
    ks, vs = k_cache[ctx_slots], v_cache[ctx_slots]
    if k_scale is not None and v_scale is not None:
        ks, vs = dequantise_kv(ks, k_scale[ctx_slots], q.dtype), dequantise_kv(vs, v_scale[ctx_slots], q.dtype)
    return qs, ks.transpose(0, 1), vs.transpose(0, 1)


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_start: int,
    q_len: int,
    ctx_slots: torch.Tensor,
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence: q [T, Hq, D] (rows q_start:q_start+q_len are its), ctx_slots [C].

    Returns [q_len, Hq, D]. Softmax in float32, as transformers' eager path. With `sinks`
    [Hq]: transformers' gpt-oss operations (the sink column concatenated, the max
    subtracted, softmax, the column dropped) in float32, where gpt-oss runs them in the
    activations' dtype (the same operations in an fp32 model).
    """
    qs, ks, vs = gather_heads(q, k_cache, v_cache, q_start, q_len, ctx_slots, k_scale, v_scale)
    groups = qs.shape[0] // ks.shape[0]
    ks = ks.repeat_interleave(groups, dim=0)
    vs = vs.repeat_interleave(groups, dim=0)
    scores = torch.matmul(qs, ks.transpose(1, 2)) * scale  # [Hq, q, C]
    mask = causal_mask(q_len, ctx_slots.numel(), window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        probs = softmax_with_sinks(scores, sinks).to(q.dtype)
    return torch.matmul(probs, vs).transpose(0, 1)  # [q, Hq, D]


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """scores [Hq, q, C] -> fp32 probabilities [Hq, q, C] whose rows sum to 1 - p(sink)."""
    sink_col = sinks.float()[:, None, None].expand(-1, scores.shape[1], 1)
    combined = torch.cat([scores.float(), sink_col], dim=-1)  # [Hq, q, C + 1]
    combined = combined - combined.amax(dim=-1, keepdim=True)  # transformers' overflow guard, kept for its bits
    return F.softmax(combined, dim=-1)[..., :-1]


def paged_attention_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_start: int,
    q_len: int,
    ctx_slots: torch.Tensor,
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `paged_attention_ref`, through torch's fused SDPA kernels
    (flash / memory-efficient on CUDA): no [q, C] score matrix is materialised. Sinks
    enter as one more key (`append_sink_key`); in a 16-bit dtype s_h is then rounded to
    it, as every score of this path is."""
    ctx_len = ctx_slots.numel()
    qs, ks, vs = (t[None] for t in gather_heads(q, k_cache, v_cache, q_start, q_len, ctx_slots, k_scale, v_scale))
    mask, causal = None, False
    if sinks is not None:
        qs, ks, vs = append_sink_key(qs, ks, vs, sinks, scale)
        mask = torch.cat([causal_mask(q_len, ctx_len, window, q.device),
                          torch.ones(q_len, 1, dtype=torch.bool, device=q.device)], dim=1)  # the sink: always seen
    elif window is not None or (1 < q_len < ctx_len):
        mask = causal_mask(q_len, ctx_len, window, q.device)
    elif q_len == ctx_len and q_len > 1:
        causal = True  # a whole sequence at once: the kernel's own causal path
    out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    return out[0, ..., : q.shape[-1]].transpose(0, 1)  # [q, Hq, D]


SINK_PAD = 8  # coordinates the sink key adds: fused SDPA kernels want head dims a multiple of 8


def append_sink_key(
    qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, sinks: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qs [1, Hq, q, D], ks/vs [1, Hkv, C, D] -> head dim D + SINK_PAD and one more key, C,
    of value 0 whose score is s_h for every query of head h: q's first new coordinate is
    s_h / scale, the sink key's is 1, every real key's 0 (their scores do not move). The
    mask stays one bool [q, C + 1] shared by the heads, where a per-head additive mask
    would cost the [Hq, q, C] this path avoids."""
    pad = lambda t: F.pad(t, (0, SINK_PAD))  # noqa: E731
    qs = pad(qs)
    qs[..., qs.shape[-1] - SINK_PAD] = (sinks.float() / scale).to(qs.dtype)[:, None]
    sink_k = ks.new_zeros(*ks.shape[:2], 1, ks.shape[-1] + SINK_PAD)
    sink_k[..., ks.shape[-1]] = 1.0
    ks = torch.cat([pad(ks), sink_k], dim=2)
    vs = torch.cat([pad(vs), vs.new_zeros(*vs.shape[:2], 1, vs.shape[-1] + SINK_PAD)], dim=2)
    return qs, ks, vs
