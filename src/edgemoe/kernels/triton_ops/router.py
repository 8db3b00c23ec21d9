"""The MoE router's kernels (contracts in `kernels/router.py`):

- `_route_topk`: softmax + top-k + renormalisation of given logits, one program per token;
- `_route_fused`: the router's projection and the same routing in one launch for decode
  batches. Programs over (block of experts, token) each compute BLOCK_E logits of one
  token (the 0.5 MB Qwen3-30B weight is read by E / BLOCK_E programs in parallel), round
  them to the activation dtype as `F.linear` does, store them in a static workspace and
  count themselves in the token's arrival counter; the program that arrives last routes
  the token from the workspace and resets the counter.

Both share `_softmax_topk` (Triton inlines it), so equal logits give equal ids and
weights on either path.

NOTE (no waiting): a program never waits for another; the last to arrive does the extra
work, whichever it is, so the grid completes in any schedule and any residency.
NOTE (graphs): the counters are zero before and after every launch (the last arriver
resets its token's), so the launch can be captured once and replayed, layer after layer.
NOTE (batch invariance): BLOCK_E, BLOCK_H and the warps depend on (E, H) only; a token's
logits are one program's fixed-order fp32 sums, whatever the other tokens are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import (
    interpreting,
    pdl_start,
    round_to,
    tl_dtype,
)

# NOTE: a function of (E, H) at most, never of T. Swept on an H200 (2026-12-01,
# scripts/gpu_kernel_bench.py, E = 128, H = 2048, CUDA graphs): BLOCK_E 1/2/4/8 x 2/4/8
# warps; 2 experts and 2 warps was the fastest at T = 1, 8 and 32 (5.3, 5.7, 8.8 µs; the
# former 4 warps 5.9, 6.2, 9.6). 64 programs per token, each one 8 KiB load of weight (no
# H loop, so one memory round trip).
BLOCK_E = 2  # experts per program
MAX_BLOCK_H = 2048  # hidden elements per load
NUM_WARPS = 2  # also the last program's: its top-k reductions cross 2 warps


@triton.jit
def _softmax_topk(x, e, E, K: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr):
    """(ids [K] int32, weights [K] fp32) of one token from its fp32 logits x [E_PAD]
    (-inf beyond E): softmax in fp32, the K largest in order, ties to the lower id."""
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)  # softmax in fp32, as torch.softmax(dtype=float32)
    k = tl.arange(0, K)
    top_w = tl.zeros([K], tl.float32)
    top_i = tl.zeros([K], tl.int32)
    remaining = tl.where(e < E, p, -1.0)
    for j in tl.static_range(K):  # the j-th largest; ties go to the lower expert id
        best = tl.max(remaining, axis=0)
        idx = tl.min(tl.where(remaining == best, e, E_PAD), axis=0)
        top_w = tl.where(k == j, best, top_w)
        top_i = tl.where(k == j, idx, top_i)
        remaining = tl.where(e == idx, -1.0, remaining)
    if RENORM:
        top_w = top_w / tl.sum(top_w, axis=0)
    return top_i, top_w


@triton.jit
def _route_topk(
    logits_ptr, ids_ptr, w_ptr, E, stride_lt, stride_it, stride_wt,
    K: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    pdl_start(USE_PDL)
    x = tl.load(logits_ptr + t * stride_lt + e, mask=e < E, other=float("-inf")).to(tl.float32)
    top_i, top_w = _softmax_topk(x, e, E, K, E_PAD, RENORM)
    k = tl.arange(0, K)
    tl.store(ids_ptr + t * stride_it + k, top_i)
    tl.store(w_ptr + t * stride_wt + k, round_to(top_w, DTYPE, INTERP).to(tl.float32))


def route_topk_triton(
    logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    if top_k & (top_k - 1):
        raise ValueError(f"top_k {top_k}: the fused router needs a power of two")
    ids = torch.empty(T, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    if T == 0:
        return ids, weights
    logits = logits.contiguous()
    pdl = pdl_enabled(logits.device)
    _route_topk[(T,)](
        logits, ids, weights, E, logits.stride(0), ids.stride(0), weights.stride(0),
        K=top_k, E_PAD=triton.next_power_of_2(E), RENORM=renormalize, DTYPE=tl_dtype(dtype),
        INTERP=interpreting(logits), USE_PDL=pdl, launch_pdl=pdl, num_warps=4 if E > 256 else 2,
    )
    return ids, weights


@triton.jit
def _route_fused(
    x_ptr, w_ptr, logits_ptr, arrivals_ptr, ids_ptr, wout_ptr, E, H, stride_xt, stride_we, stride_lt,
    K: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr, LOGIT_DTYPE: tl.constexpr,
    DTYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid_e, t = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    row_ok = rows < E
    # NOTE: the router weight is never written by a kernel, so its tile could be loaded
    # before the wait; the wait comes first anyway (one loop loads x and w together).
    pdl_start(USE_PDL)
    acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):  # products in fp32 (exact for bf16/fp16), summed in fp32
        hs = h0 + tl.arange(0, BLOCK_H)
        h_ok = hs < H
        xv = tl.load(x_ptr + t * stride_xt + hs, mask=h_ok, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_we + hs[None, :],
                     mask=row_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
        acc += wv * xv[None, :]
    # One rounding to the activation dtype, where F.linear rounds its output.
    logit = round_to(tl.sum(acc, axis=1), LOGIT_DTYPE, INTERP).to(tl.float32)
    tl.store(logits_ptr + t * stride_lt + rows, logit, mask=row_ok)
    # NOTE: every thread's stores precede the (single-thread) release of the arrival.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + t, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:  # the last of the token's programs: route it
        e = tl.arange(0, E_PAD)
        # .cg: from L2, where the other programs' stores are (never a stale L1 line).
        x = tl.load(logits_ptr + t * stride_lt + e, mask=e < E, other=float("-inf"), cache_modifier=".cg")
        top_i, top_w = _softmax_topk(x, e, E, K, E_PAD, RENORM)
        k = tl.arange(0, K)
        tl.store(ids_ptr + t * K + k, top_i)
        tl.store(wout_ptr + t * K + k, round_to(top_w, DTYPE, INTERP).to(tl.float32))
        tl.store(arrivals_ptr + t, 0)  # clean for the next layer / graph replay


def route_logits_topk_triton(
    x: torch.Tensor, w: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype,
    logits: torch.Tensor, arrivals: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], w [E, H] (x's dtype) → (ids [T, K] int32, weights [T, K] fp32) in one
    launch. `logits` [>= T, E] fp32 and `arrivals` [>= T] int32 (all zero) are the static
    workspace; after the call `logits[:T]` holds the token's logits (x's dtype's values)."""
    T, H = x.shape
    E = w.shape[0]
    if top_k & (top_k - 1):
        raise ValueError(f"top_k {top_k}: the fused router needs a power of two")
    if T > min(arrivals.shape[0], logits.shape[0]) or logits.shape[1] != E or logits.stride(1) != 1:
        raise ValueError(f"workspace {tuple(logits.shape)} does not fit {T} tokens x {E} experts")
    ids = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    if T == 0:
        return ids, weights
    if x.stride(-1) != 1:
        x = x.contiguous()
    if w.stride(-1) != 1:
        w = w.contiguous()
    block_h = min(triton.next_power_of_2(H), MAX_BLOCK_H)
    pdl = pdl_enabled(x.device)
    _route_fused[(triton.cdiv(E, BLOCK_E), T)](
        x, w, logits, arrivals, ids, weights, E, H, x.stride(0), w.stride(0), logits.stride(0),
        K=top_k, E_PAD=triton.next_power_of_2(E), RENORM=renormalize, LOGIT_DTYPE=tl_dtype(x.dtype),
        DTYPE=tl_dtype(dtype), INTERP=interpreting(x), BLOCK_E=BLOCK_E, BLOCK_H=block_h, USE_PDL=pdl, launch_pdl=pdl,
        num_warps=NUM_WARPS,
    )
    return ids, weights
