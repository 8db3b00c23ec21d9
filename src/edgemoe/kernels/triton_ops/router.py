"""The MoE router's kernels (contracts in `kernels/router.py`):

- `_route_topk`: softmax + top-k + renormalisation of given logits, one program per token;
- `_route_fused`: the router's projection and the same routing in one launch for decode
  batches. Programs over (block of experts, token) each compute BLOCK_E logits of one
  token (the 0.5 MB Qwen3-30B weight is read by E / BLOCK_E programs in parallel), round
  them to the activation dtype as `F.linear` does, store them in a static workspace and
  count themselves in the token's arrival counter; the program that arrives last routes
  the token from the workspace and resets the counter. With NORM, the layer's residual
  add and RMSNorm in front of the router too (`add_norm_route_triton`): every program
  norms its token's row itself (h = residual + attention output, 4 KiB each from L2 at
  Qwen3-30B's H = 2048), takes x = norm(h) as its input, and the token's program 0
  writes h and x for the MoE kernels that read them next: one launch fewer a layer.

Both share `_softmax_topk` (Triton inlines it), so equal logits give equal ids and
weights on either path. Its top-k is by ranks (`_topk_by_rank`: every expert's rank from
all pairwise comparisons at once) up to 256 experts, by K rounds of search beyond; the two
give the same ids and weights, bit for bit (tests/kernels/test_router_rank.py).

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
    round_trip,
    tl_dtype,
)
from edgemoe.kernels.triton_ops.norm import norm_rstd, norm_scale, norm_warps

# NOTE: a function of (E, H) at most, never of T. Swept on an H200 (2026-12-01,
# scripts/gpu_kernel_bench.py, E = 128, H = 2048, CUDA graphs): BLOCK_E 1/2/4/8 x 2/4/8
# warps, the top-k then K rounds of search; 2 experts and 2 warps was the fastest at
# T = 1, 8 and 32 (5.3, 5.7, 8.8 µs; the former 4 warps 5.9, 6.2, 9.6). 64 programs per
# token, each one 8 KiB load of weight (no H loop, so one memory round trip).
BLOCK_E = 2  # experts per program
MAX_BLOCK_H = 2048  # hidden elements per load
# The fused launch's warps: None = `router_warps(H)`, the norm kernel's for the row
# (`norm_warps`: 8 at H = 2048). NOTE: the router fused with the add + RMSNorm must take
# those (its sum of squares is then `_rms_norm`'s, bit for bit), and the plain launch the
# same (its logits' sums then match the fused one's: the two are bitwise interchangeable).
# More warps than the 2 that were fastest with the search: the rank top-k's E_PAD^2
# comparisons spread over 256 threads (64 each at E = 128). A sweep sets an int here.
NUM_WARPS: int | None = None
# Top-k by ranks up to RANK_MAX_E_PAD experts and RANK_MAX_PAIRS comparisons per thread;
# beyond (Qwen3.8-Flash-Next's 512 experts) K rounds of search. The comparisons run in
# chunks of at most RANK_CHUNK_PAIRS per thread (bounded registers: a chunk's keys are
# broadcast to every thread).
RANK_MAX_E_PAD = 256
RANK_MAX_PAIRS = 256
RANK_CHUNK_PAIRS = 64
TOPK_WARPS = 8  # `_route_topk`'s warps where it ranks (4 for the search, as before)
_LOWEST = tl.constexpr(-(2**62))  # below every int64 rank key (the padding's is about -2^38)


def router_warps(H: int) -> int:
    """The fused router's warps for hidden size H (a function of H only: batch-invariant)."""
    return NUM_WARPS or norm_warps(triton.next_power_of_2(H))


def rank_chunk(e_pad: int, warps: int) -> int:
    """The kernels' RANK_CHUNK for E_PAD experts on `warps` warps: 0 = the search; else how
    many experts' keys each chunk of the rank comparisons takes (a power of two)."""
    threads = 32 * warps
    if e_pad > RANK_MAX_E_PAD or e_pad * e_pad > RANK_MAX_PAIRS * threads:
        return 0
    chunk = e_pad
    while chunk > 1 and chunk * e_pad > RANK_CHUNK_PAIRS * threads:
        chunk //= 2
    return chunk


@triton.jit
def _softmax_topk(x, e, E, K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr,
                  CHUNK: tl.constexpr):
    """(ids [K_PAD] int32, weights [K_PAD] fp32) of one token from its fp32 logits x [E_PAD]
    (-inf beyond E): softmax in fp32, the K largest in order, ties to the lower id; entries
    K..K_PAD-1 (K_PAD: K's power of two, Qwen3.8's top-10 in 16) are weight 0, not stored.
    CHUNK > 0: by ranks, CHUNK experts' keys at a time (`_topk_by_rank`); 0: K rounds of
    search (`_topk_by_search`). Both give the same ids and weights, bit for bit."""
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)  # softmax in fp32, as torch.softmax(dtype=float32)
    q = tl.where(e < E, p, -1.0)  # padding below every probability
    if CHUNK > 0:
        top_i, top_w = _topk_by_rank(q, e, K, K_PAD, E_PAD, CHUNK)
    else:
        top_i, top_w = _topk_by_search(q, e, K, K_PAD, E_PAD)
    if RENORM:
        top_w = top_w / tl.sum(top_w, axis=0)
    return top_i, top_w


@triton.jit
def _topk_by_search(q, e, K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """The K largest of q [E_PAD] one at a time (in [K_PAD], zeros after K): K rounds of
    two dependent reductions across the program's warps (the max, then the lowest id
    holding it)."""
    k = tl.arange(0, K_PAD)
    top_w = tl.zeros([K_PAD], tl.float32)
    top_i = tl.zeros([K_PAD], tl.int32)
    remaining = q
    for j in tl.static_range(K):  # the j-th largest; ties go to the lower expert id
        best = tl.max(remaining, axis=0)
        idx = tl.min(tl.where(remaining == best, e, E_PAD), axis=0)
        top_w = tl.where(k == j, best, top_w)
        top_i = tl.where(k == j, idx, top_i)
        remaining = tl.where(e == idx, -1.0, remaining)
    return top_i, top_w


@triton.jit
def _topk_by_rank(q, e, K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """The K largest of q [E_PAD] at once (in [K_PAD], zeros after K), by rank. key_i = (q_i's bits, E_PAD-1-i) as one
    int64 (q >= 0, or the padding's -1: for these the bits' order is the values' order),
    so rank_i = #{j: key_j > key_i} = #{j: q_j > q_i} + #{j < i: q_j == q_i}: the search's
    order, ties to the lower id, a permutation of 0..E_PAD-1. The k-th largest is the key
    of rank k: one reduction gives its id and its weight (q's bits). No reduction waits on
    another's result (the search: 2K in a chain)."""
    key = q.to(tl.int32, bitcast=True).to(tl.int64) * E_PAD + (E_PAD - 1 - e)  # [E_PAD]
    key2 = tl.reshape(key, [E_PAD // CHUNK, CHUNK])
    c2 = tl.arange(0, E_PAD // CHUNK)[:, None]
    rank = tl.zeros([E_PAD], tl.int32)
    for c in tl.static_range(E_PAD // CHUNK):
        # The chunk's keys (j = c·CHUNK + 0..CHUNK-1), exactly: a max over one key and
        # _LOWEST. NOTE: a reduction's result, so the compiler moves the keys to the
        # comparisons' layout through shared memory instead of recomputing the softmax
        # there (CHUNK exp and div per thread).
        kc = tl.max(tl.where(c2 == c, key2, _LOWEST), axis=0)  # [CHUNK]
        rank += tl.sum((kc[:, None] > key[None, :]).to(tl.int32), axis=0)  # [CHUNK, E_PAD] -> [E_PAD]
    k = tl.arange(0, K_PAD)
    sel = rank[None, :] == k[:, None]  # [K_PAD, E_PAD]: one entry a row
    top = tl.max(tl.where(sel, key[None, :], _LOWEST), axis=1)  # [K_PAD], exact
    low = top % E_PAD  # the keys of real experts are >= 0 (K <= E)
    top_i = tl.where(k < K, (E_PAD - 1 - low).to(tl.int32), 0)
    top_w = tl.where(k < K, ((top - low) // E_PAD).to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    return top_i, top_w


@triton.jit
def _route_topk(
    logits_ptr, ids_ptr, w_ptr, E, stride_lt, stride_it, stride_wt,
    K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr, DTYPE: tl.constexpr,
    INTERP: tl.constexpr, RANK_CHUNK: tl.constexpr, USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    pdl_start(USE_PDL)
    x = tl.load(logits_ptr + t * stride_lt + e, mask=e < E, other=float("-inf")).to(tl.float32)
    top_i, top_w = _softmax_topk(x, e, E, K, K_PAD, E_PAD, RENORM, RANK_CHUNK)
    k = tl.arange(0, K_PAD)
    tl.store(ids_ptr + t * stride_it + k, top_i, mask=k < K)
    tl.store(w_ptr + t * stride_wt + k, round_to(top_w, DTYPE, INTERP).to(tl.float32), mask=k < K)


def route_topk_triton(
    logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"top_k {top_k} of {E} experts: top_k must be at least 1 and at most E")
    ids = torch.empty(T, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    if T == 0:
        return ids, weights
    logits = logits.contiguous()
    pdl = pdl_enabled(logits.device)
    e_pad = triton.next_power_of_2(E)
    warps = TOPK_WARPS if e_pad <= RANK_MAX_E_PAD else 4
    _route_topk[(T,)](
        logits, ids, weights, E, logits.stride(0), ids.stride(0), weights.stride(0),
        K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=e_pad, RENORM=renormalize, DTYPE=tl_dtype(dtype),
        INTERP=interpreting(logits), RANK_CHUNK=rank_chunk(e_pad, warps), USE_PDL=pdl, launch_pdl=pdl, num_warps=warps,
    )
    return ids, weights


@triton.jit
def _route_fused(
    x_ptr, w_ptr, logits_ptr, arrivals_ptr, ids_ptr, wout_ptr, E, H, stride_xt, stride_we, stride_lt,
    res_ptr, nw_ptr, h_ptr, xo_ptr, stride_rt, stride_ht, stride_ot, eps, weight_offset, bias_ptr,
    K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr, LOGIT_DTYPE: tl.constexpr,
    DTYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    RANK_CHUNK: tl.constexpr, NORM: tl.constexpr, OFFSET: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr, HAS_BIAS: tl.constexpr = False,
):
    """NORM: x_ptr holds the attention's output a, and the router's input is x = norm(h),
    h = residual + a: every program computes the row's statistic itself (BLOCK_N columns),
    then x's columns where it needs them; the token's program 0 writes h and x."""
    pid_e, t = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    row_ok = rows < E
    cols = tl.arange(0, BLOCK_H)
    # NOTE: the router weight is never written by a kernel, so its tile could be loaded
    # before the wait; the wait comes first anyway (every kernel's rule, compile-checked).
    pdl_start(USE_PDL)
    # The first weight tile first: with NORM its load is in flight while the row is normed.
    wv = _weight_tile(w_ptr, rows, row_ok, cols, H, stride_we)
    rstd = 0.0
    if NORM:
        # NOTE: a barrier keeps the compiler from sinking the tile's loads below the norm's
        # (it did, after the sum's shuffles: their latencies then added up).
        tl.debug_barrier()
        rstd = _add_norm_row(x_ptr, res_ptr, nw_ptr, h_ptr, xo_ptr, t, H, eps, weight_offset, stride_xt, stride_rt,
                             stride_ht, stride_ot, pid_e == 0, OFFSET, LOGIT_DTYPE, INTERP, BLOCK_N)
    # Products in fp32 (exact for bf16/fp16), summed in fp32, tile after tile along H.
    acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    acc += wv * _router_input(x_ptr, res_ptr, nw_ptr, t, cols, H, rstd, weight_offset, stride_xt, stride_rt,
                              NORM, OFFSET, LOGIT_DTYPE, INTERP)[None, :]
    for h0 in range(BLOCK_H, H, BLOCK_H):
        hs = h0 + cols
        xv = _router_input(x_ptr, res_ptr, nw_ptr, t, hs, H, rstd, weight_offset, stride_xt, stride_rt,
                           NORM, OFFSET, LOGIT_DTYPE, INTERP)
        acc += _weight_tile(w_ptr, rows, row_ok, hs, H, stride_we) * xv[None, :]
    # One rounding to the activation dtype, where F.linear rounds its output (with the
    # router's bias, gpt-oss's, added before it, as F.linear adds it).
    logit = tl.sum(acc, axis=1)
    if HAS_BIAS:
        logit += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    logit = round_to(logit, LOGIT_DTYPE, INTERP).to(tl.float32)
    tl.store(logits_ptr + t * stride_lt + rows, logit, mask=row_ok)
    # NOTE: every thread's stores precede the (single-thread) release of the arrival.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + t, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:  # the last of the token's programs: route it
        e = tl.arange(0, E_PAD)
        # .cg: from L2, where the other programs' stores are (never a stale L1 line).
        x = tl.load(logits_ptr + t * stride_lt + e, mask=e < E, other=float("-inf"), cache_modifier=".cg")
        top_i, top_w = _softmax_topk(x, e, E, K, K_PAD, E_PAD, RENORM, RANK_CHUNK)
        k = tl.arange(0, K_PAD)
        tl.store(ids_ptr + t * K + k, top_i, mask=k < K)
        tl.store(wout_ptr + t * K + k, round_to(top_w, DTYPE, INTERP).to(tl.float32), mask=k < K)
        tl.store(arrivals_ptr + t, 0)  # clean for the next layer / graph replay


@triton.jit
def _weight_tile(w_ptr, rows, row_ok, hs, H, stride_we):
    """The router weight's [BLOCK_E, BLOCK_H] tile at rows x columns hs, in fp32 (0 outside)."""
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_we + hs[None, :],
                   mask=row_ok[:, None] & (hs < H)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _router_input(
    x_ptr, res_ptr, nw_ptr, t, hs, H, rstd, weight_offset, stride_xt, stride_rt,
    NORM: tl.constexpr, OFFSET: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr,
):
    """Columns hs of token t's router input in fp32 (0 past H): x's, or with NORM x = norm(h)'s."""
    if NORM:
        xv = _normed_cols(x_ptr, res_ptr, nw_ptr, t, hs, hs < H, rstd, weight_offset, stride_xt, stride_rt,
                          OFFSET, DTYPE, INTERP)
    else:
        xv = tl.load(x_ptr + t * stride_xt + hs, mask=hs < H, other=0.0).to(tl.float32)
    return xv


@triton.jit
def _add_norm_row(
    a_ptr, res_ptr, nw_ptr, h_ptr, xo_ptr, t, N, eps, weight_offset, stride_at, stride_rt, stride_ht, stride_ot,
    WRITE, OFFSET: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr,
):
    """The RMSNorm statistic of h = residual + a (token t's row): `_rms_norm`'s loads, sum
    and rounding points. NOTE: bitwise that kernel's only at its BLOCK and warps
    (`norm_warps`: the sum's order follows the layout), which the launch uses. WRITE
    (one program a token): also store h and x = norm(h)."""
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    a = tl.load(a_ptr + t * stride_at + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + t * stride_rt + cols, mask=ok, other=0.0).to(tl.float32)
    h = round_trip(r + a, DTYPE, INTERP)  # torch's `residual + a` in the dtype
    rstd = norm_rstd(h, N, eps)
    if WRITE:
        w = tl.load(nw_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(h_ptr + t * stride_ht + cols, round_to(h, DTYPE, INTERP), mask=ok)
        x = norm_scale(h, rstd, w, weight_offset, OFFSET, DTYPE, INTERP)
        tl.store(xo_ptr + t * stride_ot + cols, round_to(x, DTYPE, INTERP), mask=ok)
    return rstd


@triton.jit
def _normed_cols(
    a_ptr, res_ptr, nw_ptr, t, hs, ok, rstd, weight_offset, stride_at, stride_rt,
    OFFSET: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr,
):
    """Columns hs of x = norm(residual + a) (0 where masked), in fp32 holding DTYPE values:
    the same elementwise ops as `_add_norm_row`'s x, so the same bits (the row's rstd)."""
    a = tl.load(a_ptr + t * stride_at + hs, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + t * stride_rt + hs, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(nw_ptr + hs, mask=ok, other=0.0).to(tl.float32)
    x = norm_scale(round_trip(r + a, DTYPE, INTERP), rstd, w, weight_offset, OFFSET, DTYPE, INTERP)
    return round_trip(x, DTYPE, INTERP)


def route_logits_topk_triton(
    x: torch.Tensor, w: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype,
    logits: torch.Tensor, arrivals: torch.Tensor, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], w [E, H] (x's dtype) → (ids [T, K] int32, weights [T, K] fp32) in one
    launch. `logits` [>= T, E] fp32 and `arrivals` [>= T] int32 (all zero) are the static
    workspace; after the call `logits[:T]` holds the token's logits (x's dtype's values).
    `bias` [E]: added to the logits before their rounding (`F.linear(x, w, bias)`)."""
    return _launch(x, None, w, top_k, renormalize, dtype, logits, arrivals, bias)[2:]


def add_norm_route_triton(
    a: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight_offset: float,
    w: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype, logits: torch.Tensor, arrivals: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, h, ids, weights): h = residual + a, x = rms_norm(h) (`add_rms_norm`'s Triton
    kernel's bits), routed as `route_logits_topk_triton(x, ..., bias)` routes, in one launch.
    a, residual [T, H] and norm_weight [H] in one dtype; h and x are new tensors."""
    same_dtype = residual.dtype == norm_weight.dtype == a.dtype
    if residual.shape != a.shape or norm_weight.shape != a.shape[1:] or not same_dtype:
        raise ValueError(f"residual must be {tuple(a.shape)} and the norm's weight [{a.shape[1]}], both {a.dtype}")
    x, h, ids, weights = _launch(a, (residual, norm_weight.contiguous(), eps, weight_offset), w, top_k, renormalize,
                                 dtype, logits, arrivals, bias)
    assert x is not None and h is not None
    return x, h, ids, weights


def _launch(
    x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor, float, float] | None, w: torch.Tensor, top_k: int,
    renormalize: bool, dtype: torch.dtype, logits: torch.Tensor, arrivals: torch.Tensor, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """One `_route_fused` launch; with `norm` (residual, weight, eps, offset) x is the
    attention's output and the launch returns the normed rows and the new residual first."""
    T, H = x.shape
    E = w.shape[0]
    if not 0 < top_k <= E:
        raise ValueError(f"top_k {top_k} of {E} experts: top_k must be at least 1 and at most E")
    if T > min(arrivals.shape[0], logits.shape[0]) or logits.shape[1] != E or logits.stride(1) != 1:
        raise ValueError(f"workspace {tuple(logits.shape)} does not fit {T} tokens x {E} experts")
    if bias is not None and (bias.shape != (E,) or bias.stride(0) != 1):
        raise ValueError(f"the router's bias must be [{E}] and contiguous, got {tuple(bias.shape)}")
    ids = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    normed = new_res = None
    res, nw, eps, offset = x, x, 0.0, 0.0  # unused without the norm
    if norm is not None:
        res, nw, eps, offset = norm
        res = res if res.stride(-1) == 1 else res.contiguous()
        normed, new_res = (torch.empty(T, H, dtype=x.dtype, device=x.device) for _ in range(2))  # NOTE: new storage
    if T == 0:
        return normed, new_res, ids, weights
    out = (normed, new_res) if norm is not None else (x, x)
    pdl, e_pad, warps = pdl_enabled(x.device), triton.next_power_of_2(E), router_warps(H)
    _route_fused[(triton.cdiv(E, BLOCK_E), T)](
        x, w, logits, arrivals, ids, weights, E, H, x.stride(0), w.stride(0), logits.stride(0),
        res, nw, out[1], out[0], res.stride(0), out[1].stride(0), out[0].stride(0), eps, offset,
        x if bias is None else bias, HAS_BIAS=bias is not None,
        K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=e_pad, RENORM=renormalize, LOGIT_DTYPE=tl_dtype(x.dtype), DTYPE=tl_dtype(dtype),
        INTERP=interpreting(x), BLOCK_E=BLOCK_E, BLOCK_H=min(triton.next_power_of_2(H), MAX_BLOCK_H),
        RANK_CHUNK=rank_chunk(e_pad, warps), NORM=norm is not None, OFFSET=offset != 0.0,
        BLOCK_N=triton.next_power_of_2(H), USE_PDL=pdl, launch_pdl=pdl, num_warps=warps,
    )
    return normed, new_res, ids, weights
