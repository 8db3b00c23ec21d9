"""Rotary embedding + KV-cache write, one program per token (see `kernels/rope_kv.py`),
optionally after the per-head q/k RMSNorm (NORM): the program holds every head of its
token, so the norm's statistics are a row sum of the tile it loads anyway.

fp8 caches (`FP8KV`): each kv head's rotated k (and v) is divided by its largest |x| / 448,
rounded to e4m3, and the scale stored beside it, as `edgemoe.quant.kv.quantise_kv` does."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.rope_kv import check_head_norms
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


@triton.jit
def _head_norm(x, r, w_ptr, cols, D, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """x [H_PAD, D_PAD] (fp32) times its head's rsqrt r [H_PAD], cast to DTYPE, then × the
    norm weight at `cols` in DTYPE: `rms_norm_ref`'s rounding points (weight offset 0)."""
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    return round_trip(round_trip(x * r[:, None], DTYPE, INTERP) * w[None, :], DTYPE, INTERP)


@triton.jit
def _rotate(x_ptr, stride_h, c, s, h, d, w_ptr, eps, HEADS, D, HALF: tl.constexpr, NORM: tl.constexpr,
            DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """[H_PAD, D_PAD] heads of one token, RMS-normalised when NORM, rotated on dims < 2*HALF:
    x*cos + rotate_half(x)*sin, each product and the sum rounded to DTYPE as torch's ops in
    that dtype do."""
    rot = d < 2 * HALF
    ok = (h < HEADS)[:, None] & (d < D)[None, :]
    x = tl.load(x_ptr + h[:, None] * stride_h + d[None, :], mask=ok, other=0.0).to(tl.float32)
    partner = tl.where(d < HALF, d + HALF, d - HALF)  # rotate_half: (-x2, x1)
    xp = tl.load(x_ptr + h[:, None] * stride_h + partner[None, :], mask=ok & rot[None, :], other=0.0).to(tl.float32)
    if NORM:
        # mean of squares over the D real dims (padding loads 0), as torch's x.pow(2).mean(-1) in fp32
        r = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # [H_PAD]
        x = _head_norm(x, r, w_ptr, d, D, DTYPE, INTERP)
        xp = _head_norm(xp, r, w_ptr, partner, D, DTYPE, INTERP)  # the partner dim of the same head
    xp = tl.where((d < HALF)[None, :], -xp, xp)
    y = round_trip(x * c[None, :], DTYPE, INTERP) + round_trip(xp * s[None, :], DTYPE, INTERP)
    return tl.where(rot[None, :], y, x), ok


@triton.jit
def _store_kv(c_ptr, s_ptr, loc, x, ok, heads, stride_cs, stride_ch, stride_ss, d, HKV,
              CACHE_DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr):
    """x [HKV_PAD, D_PAD] (fp32) into the cache row `loc`: as CACHE_DTYPE, or as e4m3 with a
    scale per head (its largest |x| / 448)."""
    dest = c_ptr + loc * stride_cs + heads[:, None] * stride_ch + d[None, :]
    if FP8KV:
        amax = tl.max(tl.where(ok, tl.abs(x), 0.0), axis=1)
        sc = tl.where(amax > 0, amax / 448.0, 1.0)
        tl.store(dest, f32_to_e4m3(x / sc[:, None], FP8HW, INTERP), mask=ok)  # the cache as bytes
        tl.store(s_ptr + loc * stride_ss + heads, sc, mask=heads < HKV)
    else:
        tl.store(dest, round_to(x, CACHE_DTYPE, INTERP), mask=ok)


@triton.jit
def _rope_write_kv(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, loc_ptr, qo_ptr, ks_ptr, vs_ptr,
    qw_ptr, kw_ptr, eps, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cp,
    stride_kcs, stride_kch, stride_vcs, stride_vch, stride_qot, stride_qoh, stride_ss,
    HQ, HKV, D,
    HALF: tl.constexpr, NORM: tl.constexpr, HQ_PAD: tl.constexpr, HKV_PAD: tl.constexpr, D_PAD: tl.constexpr,
    DTYPE: tl.constexpr, CACHE_DTYPE: tl.constexpr, INTERP: tl.constexpr, FP8KV: tl.constexpr, FP8HW: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pdl_start(USE_PDL)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    loc = tl.load(loc_ptr + t).to(tl.int64)
    d = tl.arange(0, D_PAD)
    j = tl.where(d < HALF, d, d - HALF)  # table column of each rotated dim
    rot = d < 2 * HALF
    c = round_trip(tl.load(cos_ptr + pos * stride_cp + j, mask=rot, other=0.0), DTYPE, INTERP)
    s = round_trip(tl.load(sin_ptr + pos * stride_cp + j, mask=rot, other=0.0), DTYPE, INTERP)
    hq = tl.arange(0, HQ_PAD)
    yq, ok_q = _rotate(q_ptr + t * stride_qt, stride_qh, c, s, hq, d, qw_ptr, eps, HQ, D, HALF, NORM, DTYPE, INTERP)
    tl.store(qo_ptr + t * stride_qot + hq[:, None] * stride_qoh + d[None, :], round_to(yq, DTYPE, INTERP), mask=ok_q)
    hk = tl.arange(0, HKV_PAD)
    yk, ok_k = _rotate(k_ptr + t * stride_kt, stride_kh, c, s, hk, d, kw_ptr, eps, HKV, D, HALF, NORM, DTYPE,
                       INTERP)
    yk = round_trip(yk, DTYPE, INTERP)
    _store_kv(kc_ptr, ks_ptr, loc, yk, ok_k, hk, stride_kcs, stride_kch, stride_ss, d, HKV, CACHE_DTYPE, INTERP, FP8KV,
              FP8HW)
    vv = tl.load(v_ptr + t * stride_vt + hk[:, None] * stride_vh + d[None, :], mask=ok_k, other=0.0)
    _store_kv(vc_ptr, vs_ptr, loc, vv.to(tl.float32), ok_k, hk, stride_vcs, stride_vch, stride_ss, d, HKV,
              CACHE_DTYPE, INTERP, FP8KV, FP8HW)


def rope_write_kv_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    q_norm_w: torch.Tensor | None = None, k_norm_w: torch.Tensor | None = None, norm_eps: float = 1e-6,
) -> torch.Tensor:
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    half = cos.shape[1]
    if 2 * half > D or cos.stride() != sin.stride() or cos.stride(-1) != 1:
        raise ValueError(f"cos/sin must be contiguous [P, R/2] with R <= D ({D}); got {tuple(cos.shape)}")
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
    # NOTE: the launch depends on the heads and head dim only, never on T (one program per
    # token): batch invariant, and a CUDA graph holds it for any batch.
    _rope_write_kv[(T,)](
        q, k, v, positions, cos, sin, kc, vc, out_loc, q_out, ks, vs, qw, kw, float(norm_eps),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), q_out.stride(0), q_out.stride(1),
        stride_ss, Hq, Hkv, D,
        HALF=half, NORM=norm, HQ_PAD=triton.next_power_of_2(Hq), HKV_PAD=triton.next_power_of_2(Hkv),
        D_PAD=triton.next_power_of_2(D), DTYPE=tl_dtype(q.dtype),
        CACHE_DTYPE=tl.uint8 if fp8 else tl_dtype(k_cache.dtype), INTERP=interpreting(q), FP8KV=fp8,
        FP8HW=fp8_hardware(q), USE_PDL=pdl, launch_pdl=pdl, num_warps=4,
    )
    return q_out
