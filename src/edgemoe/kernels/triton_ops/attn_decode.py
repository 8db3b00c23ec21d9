"""Paged decode attention (one query per sequence), split over the context, in two launches.

Launch 1 (`_decode_split`): one program per (sequence, kv head, split) handles all
Hq/Hkv query heads of its kv head (each K/V row is read once per group) and writes the
split's normalised output and log-sum-exp (base 2) in fp32 to the workspace. Launch 2
(`_decode_merge`): one program per (sequence, query head) merges that sequence's splits,
a chunk of them per step in a fixed order (`merge_splits`).

Why two launches: a one-launch form (the last split of each (sequence, kv head) to
arrive merged, through atomic arrival counters) measured slower everywhere on an H200
on 2026-12-01 (CUDA-graph replay, 32/4 heads x 128, bf16: 7.0 vs 6.8 us at B=1 1K,
35.2 vs 33.2 at B=1 32K, 39.3 vs 35.5 at B=8 4K, 113.0 vs 102.1 at B=32 4K; a whole
decode step, 395 vs 373 us over 48 layers), so it was removed.

The key-block step (page table, scores, online softmax, P·V) is attn_common.py's, shared
with the extend kernel; so is the fp8 cache's (`FP8KV`) reading.

Attention sinks (`HAS_SINKS`) enter in the merge only: it starts each row's log-sum-exp
merge from its head's sink, as a split of LSE s_h and output 0, so the sink is in the
denominator exactly once whatever the split count, the splits and their workspace stay
as they are (a split does not know whether it is its sequence's first live one, and the
merge already runs per query head, the sink's granularity).

NOTE: a sequence's context is cut into SPLITS splits of ceil(len / SPLITS) positions
rounded up to a key block (and to MIN_BLOCKS blocks at least), so the cut depends only on
the sequence's own length (its result never depends on the batch), batch 1 gets SPLITS x
Hkv programs at long contexts (1K: 16 one-block splits; 32K: 64 of 512 positions, at
the defaults), and the grid and workspace (B x Hq x SPLITS x (D + 1) fp32) never depend
on the context, so a CUDA graph holds both launches. Splits holding no visible key (past
the sequence's end, or before its window) exit at once, and the merge reads only splits
`first..last-1` (`split_bounds`), so their unwritten workspace is never read.

Per sequence, by its own length only: a split of LONG_BLOCKS key blocks or more runs a
software-pipelined copy of the key-block loop (LONG_STAGES: loads ahead, the same arithmetic
in the same order), a shorter one the plain loop (STAGES: a pipeline's prologue is pure
latency on one block); a sequence of WIDE_SPLITS live splits or more merges WIDE_CHUNK
splits a step (all of them, one round trip), a shorter one MERGE_CHUNK (a wide tile of
mostly masked rows costs at 1K). Equal stages (chunks) compile one loop.

The tile constants (splits, block, warps, stages, merge chunk, minimum split length, the
two thresholds and the long loop's stages and wide merge's chunk) are
`attn_decode_tiles.py`'s, read per call (`EDGEMOE_ATTN_DECODE_TILES` overrides them for
tuning sweeps; the memory plan sizes the workspace from the same place).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.attn_decode_tiles import block_n_for, merge_warps, tiles_for
from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.attn_common import (
    kv_slots,
    pv_accumulate,
    qk_scores,
    sink_logit,
    softmax_step,
)
from edgemoe.kernels.triton_ops.common import (
    fp8_hardware,
    interpreting,
    pdl_start,
    round_to,
    tl_dtype,
)

LOG2E = 1.4426950408889634


@triton.jit
def split_bounds(seq_len, window, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_BLOCKS: tl.constexpr):
    """(first visible position, split length, first split, end split) of a sequence:
    splits first..end-1 hold its visible keys (end <= SPLITS), every other split none."""
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    split_len = tl.maximum(tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N), MIN_BLOCKS) * BLOCK_N
    return lo, split_len, lo // split_len, tl.cdiv(seq_len, split_len)


@triton.jit
def merge_splits(o_row, lse_row, out_row, d_ok, stride_os, first, last, sinks_ptr, h,
                 DTYPE: tl.constexpr, INTERP: tl.constexpr, CHUNK: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Merges splits first..last-1 of one query row (o_row [1, D_PAD] and lse_row: split
    0's partial output and LSE; stride_os to the next split) and stores it to out_row in
    DTYPE. CHUNK splits a step, read as one [CHUNK, D_PAD] tile: the merge is
    latency-bound, one round trip a step. The order is fixed by the split count and CHUNK
    alone: deterministic and batch-invariant. Splits past `last` weigh 0 (LSE -inf).
    HAS_SINKS: head h's sink is merged first, as a split of LSE s_h (base 2) and output 0."""
    c = tl.arange(0, CHUNK)[:, None]
    if HAS_SINKS:
        e_max = tl.zeros([1, 1], tl.float32) + sink_logit(sinks_ptr, h)
        e_sum = tl.full([1, 1], 1.0, tl.float32)  # exp2(s_h - e_max)
    else:
        e_max = tl.full([1, 1], float("-inf"), tl.float32)
        e_sum = tl.zeros([1, 1], tl.float32)
    acc = tl.zeros(o_row.shape, tl.float32)
    for s0 in range(first, last, CHUNK):
        live = s0 + c < last
        lse = tl.load(lse_row + (s0 + c), mask=live, other=float("-inf"))
        o = tl.load(o_row + (s0 + c) * stride_os, mask=live & d_ok, other=0.0)
        # split s0 is live, so new_max is finite: dead splits get weight exp2(-inf) = 0
        # (and a sink of logit -inf, old_scale 0)
        new_max = tl.maximum(e_max, tl.max(lse, axis=0, keep_dims=True))
        old_scale = tl.exp2(e_max - new_max)
        w = tl.exp2(lse - new_max)
        acc = acc * old_scale + tl.sum(o * w, axis=0, keep_dims=True)
        e_sum = e_sum * old_scale + tl.sum(w, axis=0, keep_dims=True)
        e_max = new_max
    tl.store(out_row, round_to(acc / e_sum, DTYPE, INTERP), mask=d_ok)


@triton.jit
def split_loop(q, k_ptr, v_ptr, pt_ptr, ks_ptr, vs_ptr, row, kvh, d, n_first, lo, end,
               stride_ks, stride_kh, stride_vs, stride_vh, stride_pr, stride_ss, qk_scale, page_size,
               G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
               NUM_STAGES: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr,
               FP8HW: tl.constexpr):
    """(running max, running sum, unnormalised output) of one split's key blocks n_first..end-1
    (n_first a multiple of BLOCK_N holding a visible key). NUM_STAGES software-pipelines the
    loop: the loads move ahead, the arithmetic and its order stay the same."""
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for n0 in tl.range(n_first, end, BLOCK_N, num_stages=NUM_STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = (n < end) & (n >= lo)
        slot = kv_slots(pt_ptr, row, stride_pr, n, n < end, page_size)
        kv_ok = n_ok[:, None] & (d < D)[None, :]
        s = qk_scores(q, k_ptr, ks_ptr, slot, kvh, d, kv_ok, n_ok, stride_ks, stride_kh, stride_ss, qk_scale,
                      DTYPE, INTERP, FP8KV, FP8HW)
        # The first block holds a visible key (the caller's): no row's max stays -inf.
        m_new, l, alpha, p = softmax_step(m, l, s, n_ok[None, :], False)
        acc = pv_accumulate(acc, alpha, p, v_ptr, vs_ptr, slot, kvh, d, kv_ok, n_ok, stride_vs, stride_vh, stride_ss,
                            DTYPE, INTERP, FP8KV, FP8HW)
        m = m_new
    return m, l, acc


@triton.jit
def _decode_split(
    q_ptr, k_ptr, v_ptr, pt_ptr, rows_ptr, lens_ptr, o_ptr, lse_ptr, ks_ptr, vs_ptr,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_pr,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ss,
    qk_scale, window, page_size,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, MIN_BLOCKS: tl.constexpr, DTYPE: tl.constexpr,
    INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr, USE_PDL: tl.constexpr,
    STAGES: tl.constexpr, LONG_BLOCKS: tl.constexpr, LONG_STAGES: tl.constexpr,
):
    """Launch 1: one program per (sequence, kv head, split), all G query heads at once."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pdl_start(USE_PDL)  # NOTE: before the early return below too (see pdl_start)
    seq_len = tl.load(lens_ptr + b)
    # The page-table row and the queries do not depend on the length: loaded before the
    # branch, their round trips overlap its (a short split is latency: lens, then pages, then K/V).
    row = tl.load(rows_ptr + b).to(tl.int64)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    heads = kvh * G + g
    hd_ok = (g < G)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=hd_ok, other=0.0)
    lo, split_len, first, last = split_bounds(seq_len, window, SPLITS, BLOCK_N, MIN_BLOCKS)
    if (split < first) | (split >= last):  # no visible key here
        return
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    # Blocks start at multiples of BLOCK_N, so the first block holds a visible key.
    n_first = tl.maximum(start, lo // BLOCK_N * BLOCK_N)
    # NOTE: the loop is chosen by this split's block count, a function of the sequence's own
    # length (and window) only: batch-invariant. Both loops do the same arithmetic in the same
    # order (pipelining moves loads only); the pipelined one's prologue is latency a split of
    # one or two blocks cannot hide, so short splits take the plain one.
    if LONG_STAGES != STAGES:
        if tl.cdiv(end - n_first, BLOCK_N) >= LONG_BLOCKS:
            m, l, acc = split_loop(q, k_ptr, v_ptr, pt_ptr, ks_ptr, vs_ptr, row, kvh, d, n_first, lo, end,
                                   stride_ks, stride_kh, stride_vs, stride_vh, stride_pr, stride_ss, qk_scale,
                                   page_size, G_PAD, D, D_PAD, BLOCK_N, LONG_STAGES, DTYPE, INTERP, FP8KV, FP8HW)
        else:
            m, l, acc = split_loop(q, k_ptr, v_ptr, pt_ptr, ks_ptr, vs_ptr, row, kvh, d, n_first, lo, end,
                                   stride_ks, stride_kh, stride_vs, stride_vh, stride_pr, stride_ss, qk_scale,
                                   page_size, G_PAD, D, D_PAD, BLOCK_N, STAGES, DTYPE, INTERP, FP8KV, FP8HW)
    else:
        m, l, acc = split_loop(q, k_ptr, v_ptr, pt_ptr, ks_ptr, vs_ptr, row, kvh, d, n_first, lo, end,
                               stride_ks, stride_kh, stride_vs, stride_vh, stride_pr, stride_ss, qk_scale,
                               page_size, G_PAD, D, D_PAD, BLOCK_N, STAGES, DTYPE, INTERP, FP8KV, FP8HW)
    base = b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(o_ptr + base, acc / l[:, None], mask=hd_ok)
    tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, m + tl.log2(l), mask=g < G)


@triton.jit
def _decode_merge(
    o_ptr, lse_ptr, lens_ptr, out_ptr, sinks_ptr,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outb, stride_outh,
    window,
    D: tl.constexpr, D_PAD: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_BLOCKS: tl.constexpr,
    DTYPE: tl.constexpr, INTERP: tl.constexpr, CHUNK: tl.constexpr, USE_PDL: tl.constexpr,
    WIDE_SPLITS: tl.constexpr, WIDE_CHUNK: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Launch 2: one program per (sequence, query head) merges its splits (and its sink)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    pdl_start(USE_PDL)
    seq_len = tl.load(lens_ptr + b)
    _lo, _split_len, first, last = split_bounds(seq_len, window, SPLITS, BLOCK_N, MIN_BLOCKS)
    d = tl.arange(0, D_PAD)[None, :]
    o_row = o_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + d
    out_row = out_ptr + b.to(tl.int64) * stride_outb + h * stride_outh + d
    lse_row = lse_ptr + b * stride_lb + h * stride_lh
    # NOTE: the chunk is chosen by the sequence's live splits (its own length only): the sum
    # order differs between the two, deterministically per length. A wide chunk is one round
    # trip for many splits; on few it reads mostly masked rows and reduces across warps.
    if WIDE_CHUNK != CHUNK:
        if last - first >= WIDE_SPLITS:
            merge_splits(o_row, lse_row, out_row, d < D, stride_os, first, last, sinks_ptr, h, DTYPE, INTERP,
                         WIDE_CHUNK, HAS_SINKS)
        else:
            merge_splits(o_row, lse_row, out_row, d < D, stride_os, first, last, sinks_ptr, h, DTYPE, INTERP,
                         CHUNK, HAS_SINKS)
    else:
        merge_splits(o_row, lse_row, out_row, d < D, stride_os, first, last, sinks_ptr, h, DTYPE, INTERP, CHUNK,
                     HAS_SINKS)


def kv_scales(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
              k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(k scales, v scales, their slot stride) for an fp8 cache; the cache itself as
    never-read placeholders otherwise."""
    if k_scale is None or v_scale is None:
        return k_cache, k_cache, 0
    if k_scale.stride() != v_scale.stride() or k_scale.stride(-1) != 1:
        raise ValueError("k_scale / v_scale must be [num_slots, Hkv] with the same layout")
    return k_scale, v_scale, k_scale.stride(0)


def sink_arg(sinks: torch.Tensor | None, num_heads: int, q: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the sinks pointer argument, HAS_SINKS): the sinks, checked, or q as a never-read
    placeholder."""
    if sinks is None:
        return q, False
    if sinks.shape != (num_heads,) or sinks.dtype != torch.float32 or sinks.device != q.device:
        raise ValueError(f"sinks must be [{num_heads}] float32 on {q.device}, got {tuple(sinks.shape)} "
                         f"{sinks.dtype} on {sinks.device}")
    return sinks, True


def kv_bytes(cache: torch.Tensor) -> torch.Tensor:
    """An e4m3 cache as its bytes (sm_80/86 Triton has no e4m3 pointer type); others as is."""
    return cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache


def decode_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int, scale: float, window: int | None,
    out: torch.Tensor, max_seq_len: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Two launches: the splits (`_decode_split`; a cache whose value is its key and whose row
    is no power of two, `attn_decode_shared`'s), then their merge (`_decode_merge`, which
    adds the sinks)."""
    # NOTE: imported here: attn_decode_shared imports this module's split_bounds.
    from edgemoe.kernels.triton_ops.attn_decode_shared import shared_split, takes_shared_split

    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    if B == 0:
        return out
    if Hq % Hkv or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("need Hq % Hkv == 0 and a unit stride on the head dim")
    G, D_PAD = Hq // Hkv, triton.next_power_of_2(D)
    shared = takes_shared_split(k_cache, v_cache, k_scale)  # MLA's latent row: V is K, 576 = 512 + 64 dims
    t = tiles_for(D, shared)
    # NOTE: `max_seq_len` sizes nothing (kept in the signature): the grid is t.splits wide.
    # The workspace's bytes: attn_decode_tiles.split_workspace_bytes (the memory plan's).
    o_part = torch.empty(B, Hq, t.splits, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, Hq, t.splits, dtype=torch.float32, device=q.device)
    block_n = block_n_for(t, D)
    dtype, interp, win = tl_dtype(q.dtype), interpreting(q), window or 0
    ks, vs, stride_ss = kv_scales(k_scale, v_scale, k_cache)
    sinks_arg, has_sinks = sink_arg(sinks, Hq, q)
    k_cache, v_cache = kv_bytes(k_cache), kv_bytes(v_cache)
    pdl = pdl_enabled(q.device)
    if shared:
        shared_split(q, k_cache, page_table, req_rows, seq_lens, page_size, scale * LOG2E, win, o_part, lse, block_n,
                     t.splits, t.min_blocks, t.warps, t.stages, dtype, interp, pdl)
    else:
        _decode_split[(B, Hkv, t.splits)](
            q, k_cache, v_cache, page_table, req_rows, seq_lens, o_part, lse, ks, vs,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            page_table.stride(0), o_part.stride(0), o_part.stride(1), o_part.stride(2), lse.stride(0), lse.stride(1),
            stride_ss, scale * LOG2E, win, page_size,
            G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, D_PAD=D_PAD, BLOCK_N=block_n, SPLITS=t.splits,
            MIN_BLOCKS=t.min_blocks, DTYPE=dtype, INTERP=interp, FP8KV=k_scale is not None, FP8HW=fp8_hardware(q),
            USE_PDL=pdl, STAGES=t.stages, LONG_BLOCKS=t.long_blocks, LONG_STAGES=t.long_stages, launch_pdl=pdl,
            num_warps=t.warps, num_stages=t.stages,
        )
    _decode_merge[(B, Hq)](
        o_part, lse, seq_lens, out, sinks_arg,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), lse.stride(0), lse.stride(1), out.stride(0),
        out.stride(1), win, D=D, D_PAD=D_PAD, SPLITS=t.splits, BLOCK_N=block_n, MIN_BLOCKS=t.min_blocks, DTYPE=dtype,
        INTERP=interp, CHUNK=t.merge_chunk, USE_PDL=pdl, WIDE_SPLITS=t.wide_splits, WIDE_CHUNK=t.wide_chunk,
        HAS_SINKS=has_sinks, launch_pdl=pdl, num_warps=merge_warps(t, D_PAD),
    )
    return out
