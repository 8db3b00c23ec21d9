"""Rotary embedding + KV-cache write (see `kernels/rope_kv.py`), optionally after the
per-head q/k RMSNorm (NORM), one program per (token, kv head).

Grid: program (t, g) handles token t's kv head g (its k and v) and the q heads
g·QG … g·QG + QG - 1, QG = ceil(HQ / HKV) (the GQA group when HKV divides HQ; otherwise
just a partition of the q heads). Why this split: a decode step's token is ~20 KB of
latency-bound work; one program a token ran every memory round trip of the token in series
on one SM. HKV programs a token spread it over HKV SMs (4 for Qwen3-30B-A3B), and the unit
is natural: a kv head and its group share the token's cos/sin, and the per-head norm's
statistics stay a row sum of the tile the program loads anyway. Finer splits (a q head a
program) would repeat pos/cos/sin/weight loads per head for little more overlap. The grid
depends on the head counts only, never on T (batch invariance; one CUDA graph holds any
batch); T = 8192 prefill gets HKV × T programs of 1/HKV the work each, the same HBM bytes.
A group too wide for one program (MLA: 20 q heads over one 576-wide latent row, padded to a
[32, 1,024] tile, spilled: 22 µs a layer on an H100, 2026-12-06) is dealt in chunks of
QC heads (`q_chunk`: [QC_PAD, D_PAD] at most 4,096 values), each a program of its own; the
first chunk of a kv head writes its k and v. Chunks depend on the head counts and D only.

NOTE: inside a program every load is issued before anything is computed or stored: the
q/k/v tiles, their rotate_half partners and the norm weights first (independent of
everything), then cos/sin (they need pos), then the stores. The compiler cannot move a
load above a store it cannot prove does not alias, so the code's order is the order the
round trips are in flight (ptxas may still put a few shuffles of the norm's sums between
the two halves of the loads; docs/kernels.md).

fp8 caches (`FP8KV`): each kv head's rotated k (and v) is divided by its largest |x| / 448,
rounded to e4m3, and the scale stored beside it, as `edgemoe.quant.kv.quantise_kv` does."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.norm_fused import check_head_norms
from edgemoe.kernels.triton_ops.attn_decode import kv_bytes, kv_scales
from edgemoe.kernels.triton_ops.common import (
    f32_to_e4m3,
    fp8_hardware,
    interpreting,
    pdl_start,
    round_to,
    round_trip,
    tl_dtype,
)

NUM_WARPS = 4  # a [8, 128] bf16 q tile (Qwen3's group): one 16-byte load a thread
MAX_TILE = 4096  # q tile values a program takes at most ([QC_PAD, D_PAD]; wider groups are chunked)


@triton.jit
def _load_heads(x_ptr, stride_h, h, live, d, D, HALF: tl.constexpr):
    """Heads `h` [H_PAD] of one token where `live` as loaded ([H_PAD, D_PAD], the input
    dtype), the rotate_half partner of each rotated dim (0 elsewhere), and the mask of the
    real elements."""
    ok = live[:, None] & (d < D)[None, :]
    rows = x_ptr + h[:, None] * stride_h
    partner = tl.where(d < HALF, d + HALF, d - HALF)  # rotate_half: (-x2, x1)
    x = tl.load(rows + d[None, :], mask=ok, other=0.0)
    xp = tl.load(rows + partner[None, :], mask=ok & (d < 2 * HALF)[None, :], other=0.0)
    return x, xp, ok


@triton.jit
def _rows_of(ptr, cols, mask, H_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """The vector ptr[cols] (0 where not `mask`) loaded as a [H_PAD, D_PAD] tile, each row
    the same.

    NOTE: loaded in the tile's shape, not as a [D_PAD] vector: Triton gives a load the
    layout of the same-shaped loads and stores it feeds (each thread loads the columns it
    holds; L1 serves the repeats), where a vector would be converted to the tile's layout
    through shared memory: a barrier right after its load, and no load below a barrier is
    issued before it (the cos/sin and weight loads went out one round trip after another)."""
    cols2 = tl.broadcast_to(cols[None, :], (H_PAD, D_PAD))
    return tl.load(ptr + cols2, mask=tl.broadcast_to(mask[None, :], (H_PAD, D_PAD)), other=0.0)


@triton.jit
def _load_norm_weight(w_ptr, d, D, HALF: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """The head norm's weight at each dim and at its rotate_half partner, [H_PAD, D_PAD]."""
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    return _rows_of(w_ptr, d, d < D, H_PAD, D_PAD), _rows_of(w_ptr, partner, partner < D, H_PAD, D_PAD)


@triton.jit
def _load_tables(cos_ptr, sin_ptr, pos, stride_cp, d, HALF: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """cos and sin at `pos` for each dim ([H_PAD, D_PAD], fp32; 0 past the rotated dims)."""
    j = tl.where(d < HALF, d, d - HALF)  # table column of each rotated dim
    rot = d < 2 * HALF
    row = pos * stride_cp
    return _rows_of(cos_ptr + row, j, rot, H_PAD, D_PAD), _rows_of(sin_ptr + row, j, rot, H_PAD, D_PAD)


@triton.jit
def _head_norm(x, r, w, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """x [H_PAD, D_PAD] (fp32) times its head's rsqrt r [H_PAD], cast to DTYPE, then × the
    norm weight w (as loaded) in DTYPE: `rms_norm_ref`'s rounding points (weight offset 0)."""
    return round_trip(round_trip(x * r[:, None], DTYPE, INTERP) * w.to(tl.float32), DTYPE, INTERP)


@triton.jit
def _norm_rotate(x, xp, c, s, w, wp, d, eps, D, HALF: tl.constexpr, NORM: tl.constexpr, DTYPE: tl.constexpr,
                 INTERP: tl.constexpr):
    """Loaded heads x and partners xp, RMS-normalised when NORM, rotated on dims < 2*HALF:
    x*cos + rotate_half(x)*sin with the tables rounded to DTYPE, each product and the sum
    rounded to DTYPE as torch's ops in that dtype do (fp32 result)."""
    x = x.to(tl.float32)
    xp = xp.to(tl.float32)
    if NORM:
        # mean of squares over the D real dims (padding loads 0), as torch's x.pow(2).mean(-1) in fp32
        r = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # [H_PAD]
        x = _head_norm(x, r, w, DTYPE, INTERP)
        xp = _head_norm(xp, r, wp, DTYPE, INTERP)  # the partner dim of the same head
    xp = tl.where((d < HALF)[None, :], xp * -1.0, xp)  # not -xp: Triton negates as 0 - x, +0 for +0 (torch: -0)
    c = round_trip(c, DTYPE, INTERP)
    s = round_trip(s, DTYPE, INTERP)
    y = round_trip(x * c, DTYPE, INTERP) + round_trip(xp * s, DTYPE, INTERP)
    return tl.where((d < 2 * HALF)[None, :], y, x)


@triton.jit
def _store_kv(c_ptr, s_ptr, loc, x, ok, heads, live, stride_cs, stride_ch, stride_ss, d,
              CACHE_DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr):
    """x [H_PAD, D_PAD] (fp32) into the cache row `loc` where `ok` (heads where `live`): as
    CACHE_DTYPE, or as e4m3 with a scale per head (its largest |x| / 448)."""
    dest = c_ptr + loc * stride_cs + heads[:, None] * stride_ch + d[None, :]
    if FP8KV:
        amax = tl.max(tl.where(ok, tl.abs(x), 0.0), axis=1)
        sc = tl.where(amax > 0, amax / 448.0, 1.0)
        tl.store(dest, f32_to_e4m3(x / sc[:, None], FP8HW, INTERP), mask=ok)  # the cache as bytes
        tl.store(s_ptr + loc * stride_ss + heads, sc, mask=live)
    else:
        tl.store(dest, round_to(x, CACHE_DTYPE, INTERP), mask=ok)


@triton.jit
def _rope_write_kv(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, loc_ptr, qo_ptr, ks_ptr, vs_ptr,
    qw_ptr, kw_ptr, eps, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cp,
    stride_kcs, stride_kch, stride_vcs, stride_vch, stride_qot, stride_qoh, stride_ss,
    HQ, D,
    HKV: tl.constexpr, HKV_PAD: tl.constexpr, QG: tl.constexpr, QC: tl.constexpr, QC_PAD: tl.constexpr,
    CHUNKS: tl.constexpr, HALF: tl.constexpr, NORM: tl.constexpr,
    D_PAD: tl.constexpr, DTYPE: tl.constexpr, CACHE_DTYPE: tl.constexpr, INTERP: tl.constexpr,
    FP8KV: tl.constexpr, FP8HW: tl.constexpr, USE_PDL: tl.constexpr, HAS_V: tl.constexpr,
):
    pdl_start(USE_PDL)
    # A token's HKV × CHUNKS programs are adjacent (pid = (t·HKV + g)·CHUNKS + c): they share
    # its cos/sin rows in L2/L1.
    pid = tl.program_id(0)
    c = pid % CHUNKS
    g = (pid // CHUNKS) % HKV
    t = (pid // (CHUNKS * HKV)).to(tl.int64)
    d = tl.arange(0, D_PAD)
    j = c * QC + tl.arange(0, QC_PAD)  # the chunk's heads within the group
    hq = g * QG + j
    live_q = (tl.arange(0, QC_PAD) < QC) & (j < QG) & (hq < HQ)
    # NOTE: k and v are [HKV_PAD, D_PAD] tiles of the token's kv heads with only row g live
    # (the others masked: never read or written). A [1, D_PAD] tile would spread its one row
    # over the 4 warps, so the norm's row sum would cross warps through shared memory (a
    # barrier on the latency path) in another order; this is the previous kernel's k tile
    # and layout, each row within one warp.
    hk = tl.arange(0, HKV_PAD)
    live_k = (hk == g) & (c == 0)  # the kv head's first chunk writes its k and v
    # Loads, independent ones first (see the module docstring).
    pos = tl.load(pos_ptr + t).to(tl.int64)
    loc = tl.load(loc_ptr + t).to(tl.int64)
    xq, xq_p, ok_q = _load_heads(q_ptr + t * stride_qt, stride_qh, hq, live_q, d, D, HALF)
    xk, xk_p, ok_k = _load_heads(k_ptr + t * stride_kt, stride_kh, hk, live_k, d, D, HALF)
    if HAS_V:  # else the value is the key: its cache is k's, written once below
        vv = tl.load(v_ptr + t * stride_vt + hk[:, None] * stride_vh + d[None, :], mask=ok_k, other=0.0)
    if NORM:
        wq, wq_p = _load_norm_weight(qw_ptr, d, D, HALF, QC_PAD, D_PAD)
        wk, wk_p = _load_norm_weight(kw_ptr, d, D, HALF, HKV_PAD, D_PAD)
    else:
        wq, wq_p, wk, wk_p = d, d, d, d  # unread without NORM
    # Then those that wait for pos: the tables, once in each tile's shape (see `_rows_of`).
    cq, sq = _load_tables(cos_ptr, sin_ptr, pos, stride_cp, d, HALF, QC_PAD, D_PAD)
    ck, sk = _load_tables(cos_ptr, sin_ptr, pos, stride_cp, d, HALF, HKV_PAD, D_PAD)
    # Compute, then the stores.
    yq = _norm_rotate(xq, xq_p, cq, sq, wq, wq_p, d, eps, D, HALF, NORM, DTYPE, INTERP)
    yk = round_trip(_norm_rotate(xk, xk_p, ck, sk, wk, wk_p, d, eps, D, HALF, NORM, DTYPE, INTERP), DTYPE, INTERP)
    tl.store(qo_ptr + t * stride_qot + hq[:, None] * stride_qoh + d[None, :], round_to(yq, DTYPE, INTERP), mask=ok_q)
    _store_kv(kc_ptr, ks_ptr, loc, yk, ok_k, hk, live_k, stride_kcs, stride_kch, stride_ss, d, CACHE_DTYPE, INTERP,
              FP8KV, FP8HW)
    if HAS_V:
        _store_kv(vc_ptr, vs_ptr, loc, vv.to(tl.float32), ok_k, hk, live_k, stride_vcs, stride_vch, stride_ss, d,
                  CACHE_DTYPE, INTERP, FP8KV, FP8HW)


def q_chunk(group: int, head_dim: int) -> int:
    """q heads a program takes of its kv head's `group`: all of them while the padded tile
    holds at most MAX_TILE values (every GQA model's group: Qwen3's [8, 128], GLM-4.5's
    [16, 128]), else as many as fit (MLA's [20 → 32, 576 → 1,024]: 4 a program, 5 programs)."""
    d_pad = triton.next_power_of_2(head_dim)
    if triton.next_power_of_2(group) * d_pad <= MAX_TILE:
        return group
    return max(1, MAX_TILE // d_pad)


def rope_write_kv_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    q_norm_w: torch.Tensor | None = None, k_norm_w: torch.Tensor | None = None, norm_eps: float = 1e-6,
) -> torch.Tensor:
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    half = cos.shape[1]
    if 2 * half > D or cos.stride() != sin.stride() or cos.stride(-1) != 1:
        raise ValueError(f"cos/sin must be contiguous [P, R/2] with R <= D ({D}); got {tuple(cos.shape)}")
    has_v = v is not None
    v = v if has_v else k  # unread without HAS_V
    for t in (q, k, v, k_cache, v_cache):
        if t.stride(-1) != 1:
            raise ValueError("need a unit stride on the head dim")
    norm = check_head_norms(q_norm_w, k_norm_w, D)
    if norm and (q_norm_w.dtype != q.dtype or k_norm_w.dtype != q.dtype):  # type: ignore[union-attr]
        raise TypeError(f"head norm weights must be in the activations' dtype {q.dtype}")
    qw = q_norm_w.contiguous() if norm else q  # type: ignore[union-attr]  # unread without NORM
    kw = k_norm_w.contiguous() if norm else q  # type: ignore[union-attr]
    q_out = torch.empty_like(q)
    if T == 0:
        return q_out
    fp8 = k_scale is not None
    ks, vs, stride_ss = kv_scales(k_scale, v_scale, k_cache)
    kc, vc = kv_bytes(k_cache), kv_bytes(v_cache)
    pdl = pdl_enabled(q.device)
    qg = triton.cdiv(Hq, Hkv)
    qc = q_chunk(qg, D)
    chunks = triton.cdiv(qg, qc)
    # NOTE: the programs a token (Hkv × chunks) and their tiles depend on the heads and head
    # dim only, never on T: batch invariant, and a CUDA graph holds it for any batch.
    _rope_write_kv[(T * Hkv * chunks,)](
        q, k, v, positions, cos, sin, kc, vc, out_loc, q_out, ks, vs, qw, kw, float(norm_eps),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), q_out.stride(0), q_out.stride(1),
        stride_ss, Hq, D,
        HKV=Hkv, HKV_PAD=triton.next_power_of_2(Hkv), QG=qg, QC=qc, QC_PAD=triton.next_power_of_2(qc), CHUNKS=chunks,
        HALF=half, NORM=norm,
        D_PAD=triton.next_power_of_2(D),
        DTYPE=tl_dtype(q.dtype), CACHE_DTYPE=tl.uint8 if fp8 else tl_dtype(k_cache.dtype), INTERP=interpreting(q),
        FP8KV=fp8, FP8HW=fp8_hardware(q), USE_PDL=pdl, HAS_V=has_v, launch_pdl=pdl, num_warps=NUM_WARPS,
    )
    return q_out
