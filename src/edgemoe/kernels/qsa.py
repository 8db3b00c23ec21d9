"""QSA sparse attention (Qwen3.8-Flash-Next's indexed attention layers) over the paged KV
cache: the indexer's compressed key blocks, the per-query block selection, and attention
over the selected tokens (transformers' `Qwen4ExpTextQSAIndexer` + masked attention).

A layer's index keys live in the KV pool's `index_k` [S, Di], one row per KV slot. Block j
of a sequence is positions [j·r, (j+1)·r) (r = `indexer_compress_ratio`). The slot of a
position that does not end a block holds that token's raw index key; the slot of a
block's last position holds, once the block is complete, the block's key:
`rope(k_norm(mean(raw keys of the block)), position j·r)`. NOTE: a block's raw keys are
read only by `compress_blocks`, in the step its last token is computed, before that slot
is overwritten; nothing reads the raw key of a block's last token after that step.

A query at position p sees nb = (p + 1) // r complete blocks; it scores each by
Σ_heads relu(q_h · key_j) / √Di, keeps the top min(budget / r, nb) blocks, and attends to
their tokens plus the incomplete tail [nb·r, p] (up to r - 1 tokens): at most
budget + r - 1 tokens, whatever the context length. Torch reference implementations; the
decode forms (`select_blocks`, `attend_selected`) take fixed shapes and read nothing back
to the host, so a CUDA graph can hold them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.paged_attention import decode_attention
from edgemoe.kernels.rotary import apply_rope
from edgemoe.quant.kv import dequantise_kv


def position_slots(
    page_table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, page_size: int
) -> torch.Tensor:
    """KV slots of `positions` [n, m] (clamped to >= 0) of the requests in `rows` [n]."""
    pos = positions.clamp(min=0)
    pages = page_table[rows.long()[:, None], pos // page_size].long()
    return pages * page_size + pos % page_size


def compress_blocks(
    index_k: torch.Tensor,  # [S, Di] one layer's index keys (raw keys of this step already written)
    positions: torch.Tensor,  # [T] the step's token positions
    out_loc: torch.Tensor,  # [T] their slots
    token_rows: torch.Tensor,  # [T] each token's page-table row
    page_table: torch.Tensor,
    page_size: int,
    ratio: int,
    k_norm: torch.nn.Module | object,  # callable [n, 1, Di] → same: the indexer's k_layernorm
    cos: torch.Tensor,  # [T, R] rotary of position - (ratio - 1), in the keys' dtype
    sin: torch.Tensor,
) -> None:
    """Every token that completes a block (position % r == r - 1) replaces its raw key by the
    block key. Fixed shapes: all tokens compute one, the others write their raw key back."""
    back = torch.arange(ratio - 1, -1, -1, device=positions.device)  # r-1 .. 0 places back
    slots = position_slots(page_table, token_rows, positions[:, None] - back[None, :], page_size)  # [T, r]
    raw = index_k[slots]  # [T, r, Di]
    pooled = raw.float().mean(dim=1).to(index_k.dtype)  # transformers: mean in fp32, cast back
    key = apply_rope(k_norm(pooled[:, None, :]), cos, sin)[:, 0]  # type: ignore[operator]
    completes = (positions % ratio == ratio - 1)[:, None]
    index_k[out_loc] = torch.where(completes, key, index_k[out_loc])


def block_keys(
    index_k: torch.Tensor, page_table: torch.Tensor, rows: torch.Tensor, num_blocks: int, page_size: int, ratio: int,
) -> torch.Tensor:
    """The keys of blocks 0 .. num_blocks-1 of the requests in `rows` [m]: [m, NB, Di]
    (blocks a request has not completed hold whatever their slot holds: callers mask them)."""
    ends = torch.arange(num_blocks, device=rows.device) * ratio + ratio - 1
    return index_k[position_slots(page_table, rows, ends[None, :].expand(rows.numel(), -1), page_size)]


def select_blocks(
    qi: torch.Tensor,  # [n, Hi, Di] normed, rotated indexer queries
    keys: torch.Tensor,  # [m, NB, Di] block keys, m = 1 (shared) or n
    visible: torch.Tensor,  # [n] complete blocks each query sees (<= NB)
    block_topk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block ids [n, k], valid [n, k]) with k = min(block_topk, NB): each query's top
    min(block_topk, visible) blocks by Σ_h relu(q_h · key) / √Di, scored in fp32."""
    NB = keys.shape[1]
    k = min(block_topk, NB)
    if k == 0:
        empty = torch.zeros((qi.shape[0], 0), dtype=torch.long, device=qi.device)
        return empty, empty.bool()
    scores = torch.einsum("nhd,mbd->nhb" if keys.shape[0] == 1 else "nhd,nbd->nhb", qi.float(), keys.float())
    scores = torch.relu(scores).sum(dim=1) / math.sqrt(qi.shape[-1])  # [n, NB], >= 0
    seen = torch.arange(NB, device=qi.device)[None, :] < visible[:, None]
    # -1 below every real score (>= 0): unseen blocks are picked only when the seen ones run out
    top = ranked(torch.where(seen, scores, -1.0)).topk(k, dim=-1).indices
    return top, top < visible[:, None]


def ranked(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys that order as `scores` [n, NB] (>= 0, or -1 where unseen) with equal scores
    broken to the lower block id. NOTE: torch's top-k takes any of equal scores, and which
    depends on the width NB (the page table's capacity in decode): blocks whose every indexer
    head scored <= 0 tie at exactly 0, and on a tiny model a request's tokens changed with
    --kv-tokens. Non-negative floats order as their bits; -1's bits are negative (below)."""
    bits = (scores + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: no -0.0 below the zeros
    ids = torch.arange(scores.shape[-1], device=scores.device, dtype=torch.int64)
    return (bits << 32) + ((1 << 31) - 1 - ids)


def top_blocks(
    scores: torch.Tensor, visible: torch.Tensor, block_topk: int, ordered: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block ids [n, k], valid [n, k]) from scores [n, NB] (-1 where unseen), k = min(block_topk, NB);
    ordered=False: the same set in any order (no sort: ~20 µs of a 32K-block top-k on an H200)."""
    top = ranked(scores).topk(min(block_topk, scores.shape[1]), dim=-1, sorted=ordered).indices
    return top, top < visible[:, None]


def decode_block_scores_ref(
    qi: torch.Tensor, index_k: torch.Tensor, page_table: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor,
    num_blocks: int, page_size: int, ratio: int,
) -> torch.Tensor:
    """[n, NB] fp32: query i's score of each of blocks 0 .. NB-1 of its request (rows[i]),
    Σ_h relu(q_h · key) / √Di, -1 for blocks past visible[i] (`select_blocks`' scores): the
    Triton scorer's reference."""
    keys = block_keys(index_k, page_table, rows, num_blocks, page_size, ratio)
    scores = torch.relu(torch.einsum("nhd,nbd->nhb", qi.float(), keys.float())).sum(dim=1) / math.sqrt(qi.shape[-1])
    seen = torch.arange(num_blocks, device=qi.device)[None, :] < visible[:, None]
    return torch.where(seen, scores, -1.0)


def select_decode_blocks(
    qi: torch.Tensor, index_k: torch.Tensor, page_table: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor,
    num_blocks: int, page_size: int, ratio: int, block_topk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode queries' blocks (`select_blocks`' contract, each query over its own request's
    first `num_blocks` blocks). On a GPU the scores are one launch that reads the keys
    through the page table (`triton_ops/qsa.py`; the fp32 sums in another order, so scores
    agree to fp32 rounding and a near-tie may pick the other block); the top-k is torch's,
    unsorted there (its consumers take the blocks in any order)."""
    if num_blocks and use_triton(qi) and index_k.dtype == qi.dtype:
        from edgemoe.kernels.triton_ops.qsa import block_scores_triton

        scores = block_scores_triton(qi, index_k, page_table, rows, visible, num_blocks, page_size, ratio)
        return top_blocks(scores, visible, block_topk, ordered=False)
    return select_blocks(qi, block_keys(index_k, page_table, rows, num_blocks, page_size, ratio), visible, block_topk)


def attend_selected(
    q: torch.Tensor,  # [n, Hq, D]
    positions: torch.Tensor,  # [n] query positions
    rows: torch.Tensor,  # [n] page-table rows
    blocks: torch.Tensor,  # [n, k] selected block ids
    valid: torch.Tensor,  # [n, k]
    k_cache: torch.Tensor,  # [S, Hkv, D]
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    ratio: int,
    scale: float,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] an fp8 pool's scales (`--kv-cache-dtype fp8`)
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each query attends to its selected blocks' tokens and its incomplete tail: [n, Hq, D].
    Softmax in fp32, as transformers' eager path; masked tokens get -inf (exp → exactly 0)."""
    n, Hq, D = q.shape
    offs = torch.arange(ratio, device=q.device)
    tok = (blocks[:, :, None] * ratio + offs).reshape(n, -1)  # [n, k·r]
    tok_ok = valid[:, :, None].expand(-1, -1, ratio).reshape(n, -1)
    tail = ((positions + 1) // ratio * ratio)[:, None] + offs[None, : ratio - 1]  # [n, r-1]: nb·r ..
    tok = torch.cat([tok, tail], dim=1)
    tok_ok = torch.cat([tok_ok, tail <= positions[:, None]], dim=1)
    # Masked tokens read the query's own slot: an empty tail of a query at the page table's
    # last position would index past it (a device-side assert on a GPU).
    slots = position_slots(page_table, rows, torch.minimum(tok, positions[:, None]), page_size)
    Hkv = k_cache.shape[1]
    ks, vs = k_cache[slots], v_cache[slots]  # [n, N, Hkv, D]
    if k_scale is not None and v_scale is not None:
        ks, vs = dequantise_kv(ks, k_scale[slots], q.dtype), dequantise_kv(vs, v_scale[slots], q.dtype)
    qg = q.view(n, Hkv, Hq // Hkv, D)
    scores = torch.einsum("nhgd,nthd->nhgt", qg, ks) * scale
    scores = scores.masked_fill(~tok_ok[:, None, None, :], float("-inf"))
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("nhgt,nthd->nhgd", probs, vs).reshape(n, Hq, D)


def selected_page_table_ref(
    positions: torch.Tensor, rows: torch.Tensor, blocks: torch.Tensor, page_table: torch.Tensor, page_size: int,
    ratio: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode queries' selected tokens as a page table of `ratio`-token pages: (table [n, k+1]
    int32, lengths [n] int32). Row i lists its valid blocks (id < visible, in column order),
    then its incomplete tail, as pages (a block's first slot / ratio: the pool's pages hold
    whole blocks when page_size % ratio == 0), and its length is ratio · valid blocks + tail
    tokens: a paged decode attention kernel then attends to exactly `attend_selected`'s
    tokens. Columns past length / ratio hold whatever they hold (the fast path doesn't write
    them). `blocks` in any order (`top_blocks(ordered=False)`)."""
    n, k = blocks.shape
    visible = (positions + 1) // ratio
    valid = blocks < visible[:, None]
    blocks = blocks.gather(1, torch.argsort((~valid).to(torch.uint8), dim=1, stable=True))  # valid first
    used = valid.sum(dim=1)
    # The tail's block starts at pos // r · r (in the page table even when the tail is empty).
    starts = torch.cat([blocks * ratio, (positions // ratio * ratio)[:, None]], dim=1)
    table = (position_slots(page_table, rows, starts, page_size) // ratio).to(torch.int32)
    table.scatter_(1, used[:, None], table[:, k:].clone())
    lengths = used * ratio + (positions + 1 - visible * ratio)
    return table, lengths.to(torch.int32)


def attend_selected_decode(
    q: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, blocks: torch.Tensor, valid: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor, page_size: int, ratio: int,
    scale: float, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`attend_selected` for decode queries (`blocks` in any order). On a GPU, where the pool's
    pages hold whole blocks: the selection's page table in one launch
    (`selected_page_table_ref`'s contract), then the split-K paged decode kernel over it (two
    launches, fp32 scores and an online softmax; the reference rounds the scores and the
    probabilities to the dtype, so they agree to a few roundings). Elsewhere the reference."""
    if not (use_triton(q) and page_size % ratio == 0):
        return attend_selected(q, positions, rows, blocks, valid, k_cache, v_cache, page_table, page_size, ratio,
                               scale, k_scale, v_scale)
    from edgemoe.kernels.triton_ops.qsa import selected_page_table_triton

    table, lengths = selected_page_table_triton(positions, rows, blocks, page_table, page_size, ratio)
    own_rows = torch.arange(q.shape[0], dtype=torch.int32, device=q.device)
    return decode_attention(q, k_cache, v_cache, table, own_rows, lengths, ratio, scale, None, torch.empty_like(q),
                            k_scale=k_scale, v_scale=v_scale)
