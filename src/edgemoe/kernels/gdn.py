"""Gated delta rule (the GDN layers of Qwen3-Next / Qwen3.5): torch reference over a varlen batch.

The recurrence, per value head h with state S [Dk, Dv] (fp32):

    S_t = exp(g_t) * S_{t-1}
    S_t = S_t + k_t ⊗ beta_t * (v_t - S_t^T k_t)        (the delta rule: write only the correction)
    o_t = S_t^T (scale * q_t)

q/k have Hk heads, v/g/beta have Hv = Hk * r heads; key head i serves the r consecutive value
heads i*r .. i*r+r-1 (transformers' `repeat_interleave`, fla's GVA).

Batch contract shared by every implementation of the two entry points
(`chunk_gated_delta_rule*` for prefill, `recurrent_gated_delta_rule*` for decode):

- q, k [T, Hk, Dk]; v [T, Hv, Dv] (row-strided views, e.g. splits of the conv output, are
  fine); g [T, Hv] log decay (the model makes it ≤ 0); beta [T, Hv] (in (0, 1)); the T tokens
  are B sequences back to back, `cu_seqlens` [B+1] (int, starts at 0, every sequence ≥ 1 token).
- `state_pool` [N, Hv, Dk, Dv] fp32 holds one recurrent state per pool row; sequence b starts
  from row `state_idx[b]` ([B] int32/int64), or from zeros where `has_initial_state[b]` ([B]
  bool) is False: the row is then not read, so a fresh row needs no zeroing. Its final state is
  written back into the same row, in place. Rows not named in `state_idx` are untouched.
  NOTE: `state_idx` entries must be distinct (two sequences cannot share a live state).
- q/k are L2-normalised inside when `use_qk_l2norm` (x * rsqrt(sum x² + 1e-6), in fp32, as
  transformers' `use_qk_l2norm_in_kernel` and fla); the query scale defaults to Dk^-0.5.
- Returns o [T, Hv, Dv] in q's dtype. All arithmetic is fp32, as transformers' torch path.

The references here are the CPU path and the oracle; they read `cu_seqlens` on the host (one
sync), except the recurrent rule at one token per sequence, which is a few sync-free ops over
the pool rows. The fast paths (`gdn_fla.py`, `gdn_triton.py`) share the signature;
`gdn_backends.gdn_kernels` picks them by name.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton

CHUNK = 64  # the chunk of the chunked rule (transformers' and fla's default)
L2NORM_EPS = 1e-6  # transformers' l2norm and fla's l2norm_fwd both use 1e-6 inside the sqrt


class GdnGates(NamedTuple):
    g: torch.Tensor  # [T, Hv] fp32 log decay, ≤ 0
    beta: torch.Tensor  # [T, Hv] in b's dtype, in (0, 1)


def gdn_gates_ref(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> GdnGates:
    """g = -exp(A_log) * softplus(a + dt_bias) in fp32, beta = sigmoid(b); a, b [T, Hv].

    NOTE: transformers' order: A_log and a go to fp32 first (in fp16 exp(A_log) could overflow),
    dt_bias joins in fp32; beta stays in b's dtype.
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return GdnGates(g=g, beta=b.sigmoid())


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> GdnGates:
    """`gdn_gates_ref`'s contract; one launch on a GPU (`triton_ops/gdn_gates.py`: torch's
    exp and sigmoid, but softplus's log1p from Triton's log: g within a few fp32 ulps, beta
    within a rounding of b's dtype) where torch launches ~7 small kernels."""
    if not (use_triton(a) and b.dtype == a.dtype and a.dim() == 2):
        return gdn_gates_ref(a, b, A_log, dt_bias)
    from edgemoe.kernels.triton_ops.gdn_gates import gdn_gates_triton

    return GdnGates(*gdn_gates_triton(a, b, A_log, dt_bias))


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x · rsqrt(sum(x²) + eps) over the last dim (transformers' `l2norm`; fla divides by the
    sqrt, equal to rounding)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


# ---------------------------------------------------------------------------------------------
# varlen <-> padded [B, L] layout (the references run batched over sequences)


class Padded(NamedTuple):
    batch_of: torch.Tensor  # [T] sequence of each token
    pos_of: torch.Tensor  # [T] position inside its sequence
    length: int  # padded length L


def padded_layout(cu_seqlens: torch.Tensor, num_tokens: int, multiple: int, device: torch.device) -> Padded:
    """Where each flat token sits in a zero-padded [B, L] batch, L a multiple of `multiple`."""
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    batch_of = torch.repeat_interleave(torch.arange(lens.numel(), device=device), lens, output_size=num_tokens)
    pos_of = torch.arange(num_tokens, device=device) - cu[batch_of]
    longest = int(lens.max()) if lens.numel() else 0
    return Padded(batch_of, pos_of, -(-longest // multiple) * multiple)


def to_padded(x: torch.Tensor, layout: Padded, batch: int) -> torch.Tensor:
    """[T, ...] -> [B, L, ...] with zeros after each sequence's end."""
    out = x.new_zeros((batch, layout.length, *x.shape[1:]))
    out[layout.batch_of, layout.pos_of] = x
    return out


def pool_rows(state_idx: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """`state_idx` (int32 or int64) as the int64 index `index_copy_` needs, on the pool's device."""
    return state_idx.to(device=pool.device, dtype=torch.long)


class Prepared(NamedTuple):
    q: torch.Tensor  # [B, Hv, L, Dk] fp32, normalised and scaled
    k: torch.Tensor  # [B, Hv, L, Dk] fp32, normalised
    v: torch.Tensor  # [B, Hv, L, Dv] fp32
    g: torch.Tensor  # [B, Hv, L] fp32
    beta: torch.Tensor  # [B, Hv, L] fp32
    state: torch.Tensor  # [B, Hv, Dk, Dv] fp32 initial states


def prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, layout: Padded,
    state_pool: torch.Tensor, state_idx: torch.Tensor, has_initial_state: torch.Tensor | None,
    use_qk_l2norm: bool, scale: float | None,
) -> Prepared:
    """Pad, repeat key heads to value heads, go to fp32 head-major; gather initial states.

    NOTE: padded positions have k = v = g = beta = 0, so they leave a state exactly unchanged
    (decay exp(0) = 1, write beta * ... = 0): the final state of a padded sequence is exact.
    """
    batch, reps = state_idx.numel(), v.shape[1] // k.shape[1]
    q, k = q.float(), k.float()
    if use_qk_l2norm:  # normalise before padding: a zero row would be fine too, but no work wasted
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    heads = [to_padded(x, layout, batch).transpose(1, 2) for x in (q, k, v.float(), g.float(), beta.float())]
    hq, hk = (x.repeat_interleave(reps, dim=1) for x in heads[:2])
    state = state_pool.index_select(0, pool_rows(state_idx, state_pool)).float()
    if has_initial_state is not None:  # where(), not a multiply: an unread row may hold NaN
        state = torch.where(has_initial_state.view(-1, 1, 1, 1).to(state.device), state, 0.0)
    return Prepared(hq.contiguous(), hk.contiguous(), heads[2].contiguous(), heads[3], heads[4], state)


def finish(
    o: torch.Tensor, state: torch.Tensor, layout: Padded, state_pool: torch.Tensor, state_idx: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """o [B, Hv, L, Dv] -> [T, Hv, Dv] in `dtype`; final states written back into their rows."""
    state_pool.index_copy_(0, pool_rows(state_idx, state_pool), state.to(state_pool.dtype))
    return o.transpose(1, 2)[layout.batch_of, layout.pos_of].to(dtype)


# ---------------------------------------------------------------------------------------------
# the two rules on the padded batch


def chunked_scan(p: Prepared, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked (WY / UT-transform) form; L a multiple of `chunk`. Returns o, final state.

    Inside a chunk the r sequential delta updates collapse into one triangular solve:
    u = T·(beta v) are the values actually written, w = T·(beta k e^{G}) the keys that read the
    state from before the chunk, T = (I + strict_lower(beta K Kᵀ ⊙ D))⁻¹, D_ij = e^{G_i - G_j}
    (G the cumulative log decay inside the chunk). Then one matmul per chunk carries the state.
    """
    b, h, length, dk = p.k.shape
    n = length // chunk
    q, k = (x.view(b, h, n, chunk, dk) for x in (p.q, p.k))
    v = p.v.view(b, h, n, chunk, -1)
    beta = p.beta.view(b, h, n, chunk, 1)
    gcum = p.g.view(b, h, n, chunk).cumsum(-1)  # [b, h, n, c] log decay from chunk start
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (gcum[..., :, None] - gcum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # D, causal
    k_beta = k * beta
    ut = (k_beta @ k.transpose(-1, -2)) * decay  # diagonal ignored by the unitriangular solve
    u = torch.linalg.solve_triangular(ut, v * beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(ut, k_beta * gcum.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay  # [b, h, n, c, c] token-to-token inside the chunk
    q_dec = q * gcum.exp()[..., None]  # queries read the chunk-start state decayed to their step
    k_dec = k * (gcum[..., -1:] - gcum).exp()[..., None]  # keys as they stand at the chunk's end
    chunk_decay = gcum[..., -1].exp()[..., None, None]  # [b, h, n, 1, 1]
    state, o = p.state, torch.empty_like(v)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state  # the corrections this chunk writes
        o[:, :, i] = q_dec[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new
    return o.view(b, h, length, -1), state


def recurrent_scan(p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token. Returns o [B, Hv, L, Dv], final state."""
    state, o = p.state, torch.empty_like(p.v)
    for t in range(p.v.shape[2]):
        o[:, :, t], state = delta_step(state, p.q[:, :, t], p.k[:, :, t], p.v[:, :, t], p.g[:, :, t], p.beta[:, :, t])
    return o, state


def delta_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for every (sequence, head): state [B, H, Dk, Dv]; q, k [B, H, Dk]; v [B, H, Dv]; g, beta [B, H]."""
    state = state * g.exp()[..., None, None]
    predicted = (state * k[..., :, None]).sum(-2)  # Sᵀk [B, H, Dv]: what the state recalls for k
    state = state + k[..., :, None] * (beta[..., None] * (v - predicted))[..., None, :]
    return (state * q[..., :, None]).sum(-2), state


# ---------------------------------------------------------------------------------------------
# entry points (torch reference)


def chunk_gated_delta_rule_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_idx: torch.Tensor, *,
    has_initial_state: torch.Tensor | None = None, use_qk_l2norm: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """Prefill: the chunked rule (chunks of 64 from each sequence's start). See the module doc."""
    layout = padded_layout(cu_seqlens, q.shape[0], CHUNK, q.device)
    p = prepare(q, k, v, g, beta, layout, state_pool, state_idx, has_initial_state, use_qk_l2norm, scale)
    o, state = chunked_scan(p, CHUNK)
    return finish(o, state, layout, state_pool, state_idx, q.dtype)


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_idx: torch.Tensor, *,
    has_initial_state: torch.Tensor | None = None, use_qk_l2norm: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """Decode: token by token (one or a few tokens per sequence). See the module doc.

    With one token per sequence (T == B) it never reads `cu_seqlens` and makes no host sync: a
    gather of the pool rows, a few elementwise ops, a scatter back — capturable in a CUDA graph.
    """
    if q.shape[0] == state_idx.numel():  # every sequence has ≥ 1 token, so T == B means one each
        return decode_step_ref(q, k, v, g, beta, state_pool, state_idx, has_initial_state, use_qk_l2norm, scale)
    layout = padded_layout(cu_seqlens, q.shape[0], 1, q.device)
    p = prepare(q, k, v, g, beta, layout, state_pool, state_idx, has_initial_state, use_qk_l2norm, scale)
    o, state = recurrent_scan(p)
    return finish(o, state, layout, state_pool, state_idx, q.dtype)


def decode_step_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state_pool: torch.Tensor, state_idx: torch.Tensor, has_initial_state: torch.Tensor | None,
    use_qk_l2norm: bool, scale: float | None,
) -> torch.Tensor:
    """One token per sequence: q, k [B, Hk, Dk]; v [B, Hv, Dv]; no host sync."""
    dtype, reps = q.dtype, v.shape[1] // k.shape[1]
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    idx = pool_rows(state_idx, state_pool)
    state = state_pool.index_select(0, idx).float()
    if has_initial_state is not None:
        state = torch.where(has_initial_state.view(-1, 1, 1, 1), state, 0.0)
    q, k = q.repeat_interleave(reps, dim=1), k.repeat_interleave(reps, dim=1)
    o, state = delta_step(state, q, k, v.float(), g.float(), beta.float())
    state_pool.index_copy_(0, idx, state.to(state_pool.dtype))
    return o.to(dtype)
