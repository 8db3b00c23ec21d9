"""Rotary embedding (rotate-half, optionally partial) fused with the KV-cache write, and
optionally with the per-head q/k RMSNorm in front of it (Qwen3's `q_norm`/`k_norm`).

`rope_write_kv(q, k, v, positions, cos, sin, k_cache, v_cache, out_loc)` rotates the
first R = 2 * cos.shape[1] dims of every q and k head at its token's position (the
rest pass through), writes rotated k and plain v into the caches at out_loc, and
returns rotated q (`v` None: the value is the key, whose cache is k_cache's tensor —
multi-head latent attention's one row — so only rotated k is written). cos/sin [P, R/2]
are fp32 tables indexed by position, already
scaled (e.g. YaRN's attention factor). Rounding as transformers: the tables are cast
to the activation dtype, then x * cos + rotate_half(x) * sin in the dtype; the fast
path rounds at the same points and is bitwise equal in bf16/fp16. An fp8 cache passes
its scales (`k_scale`, `v_scale` [num_slots, Hkv]): k and v are quantised as they are
written, one scale per (token, kv head) (`edgemoe.quant.kv`).

Head norms (`q_norm_w`, `k_norm_w` [D], given together, with `norm_eps`): each q and k
head is first RMS-normalised over its D dims exactly as `rms_norm_ref` with weight
offset 0 (the plain `RMSNorm` of `qk_norm="head"`): fp32 statistics, the normalised
value cast to the dtype, then × weight in the dtype. The fast path's fp32 sum of squares
may differ from torch's in its last bits, so with norms it agrees with the reference to
a rounding of the dtype (as `norm_fused.rms_norm` does), not bitwise.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.norm_fused import check_head_norms, rms_norm_ref
from edgemoe.quant.kv import quantise_kv


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_partial_ref(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x [T, H, D] rotated on its first 2 * cos.shape[1] dims (transformers' order)."""
    c = cos[positions].to(x.dtype)
    s = sin[positions].to(x.dtype)
    c = torch.cat((c, c), dim=-1)[:, None, :]  # [T, 1, R]
    s = torch.cat((s, s), dim=-1)[:, None, :]
    rot = c.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * c + _rotate_half(x_rot) * s, x_pass), dim=-1)


def rope_write_kv_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor | None,  # [T, Hkv, D]; None: the value is the key (written once, rotated)
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor,  # [P, R/2] float32
    sin: torch.Tensor,  # [P, R/2] float32
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,
    out_loc: torch.Tensor,  # [T] int64
    k_scale: torch.Tensor | None = None,  # [num_slots, Hkv] float32 (fp8 caches)
    v_scale: torch.Tensor | None = None,
    q_norm_w: torch.Tensor | None = None,  # [D]: RMSNorm each q head first (with k_norm_w)
    k_norm_w: torch.Tensor | None = None,  # [D]
    norm_eps: float = 1e-6,
) -> torch.Tensor:  # rotated q [T, Hq, D]
    if check_head_norms(q_norm_w, k_norm_w, q.shape[-1]):
        q, k = rms_norm_ref(q, q_norm_w, norm_eps), rms_norm_ref(k, k_norm_w, norm_eps)  # type: ignore[arg-type]
    k_rot = apply_rope_partial_ref(k, positions, cos, sin)
    if k_scale is not None and v_scale is not None:
        k_cache[out_loc], k_scale[out_loc] = quantise_kv(k_rot)
        if v is not None:
            v_cache[out_loc], v_scale[out_loc] = quantise_kv(v)
    else:
        k_cache[out_loc] = k_rot.to(k_cache.dtype)
        if v is not None:
            v_cache[out_loc] = v.to(v_cache.dtype)
    return apply_rope_partial_ref(q, positions, cos, sin)


def rope_write_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    q_norm_w: torch.Tensor | None = None, k_norm_w: torch.Tensor | None = None, norm_eps: float = 1e-6,
) -> torch.Tensor:
    """Same contract as `rope_write_kv_ref`; on CUDA one program per (token, kv head)."""
    args = (q, k, v, positions, cos, sin, k_cache, v_cache, out_loc, k_scale, v_scale, q_norm_w, k_norm_w, norm_eps)
    # Norm weights in another dtype than q: torch's `weight * x` promotes; the reference does that.
    odd_weights = any(w is not None and w.dtype != q.dtype for w in (q_norm_w, k_norm_w))
    if not use_triton(q) or odd_weights:
        return rope_write_kv_ref(*args)
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    return rope_write_kv_triton(*args)
