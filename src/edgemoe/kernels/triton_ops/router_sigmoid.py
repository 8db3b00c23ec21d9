"""The sigmoid router's routing step in one launch (contract: `kernels/router_sigmoid.py`).

`_sigmoid_route`, one program per token, from the token's fp32 logits: sigmoid, the
selection bias, the group filter (each group's two best choice scores summed, the best
`TOPK_G` groups kept), K rounds of arg-max for the top-k (descending, as `torch.topk`),
the chosen plain scores renormalised and scaled, and the shared expert's pair appended.
It replaces ~11 small torch launches a layer (2026-12-06's GLM-4.5-Air decode profile: ~1
ms a step). Its fp32 sigmoid and sums may differ from torch's in the last bit, so a
near-tie may resolve differently than on the torch path (a token's choice never depends
on its batch: one program, fixed order).

`SOFTMAX` (DeepSeek-V2, ERNIE-4.5): the scores are the row's softmax (its max, then
exp(l - max) over their sum: torch's order of operations), and a group ranks by its best
score. The group filter recomputes each score elementwise from the same row max and sum, so
its scores are bitwise the top-k's. `HAS_BIAS` adds a selection bias in either mode (off for
DeepSeek-V2, on for ERNIE); the renormalisation divides by max(Σ, `norm_min`) + 1e-20
(ERNIE's clamp at `moe_norm_min`; 0 elsewhere).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import interpreting

_NEG = tl.constexpr(float("-inf"))


@triton.jit
def _scores(logits, row_max, row_sum, SOFTMAX: tl.constexpr):
    """The scores of `logits` (any shape): sigmoid, or softmax from the row's max and sum."""
    if SOFTMAX:
        return tl.exp(logits - row_max) / row_sum
    return 1.0 / (1.0 + tl.exp(-logits))


@triton.jit
def _kept_experts(logits_ptr, bias_ptr, e, ok, E, GS, row_max, row_sum, G: tl.constexpr, G_PAD: tl.constexpr,
                  GS_PAD: tl.constexpr, TOPK_G: tl.constexpr, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr):
    """[E_PAD] bool: the experts of the TOPK_G groups whose two best choice scores sum highest
    (SOFTMAX: whose best score is highest)."""
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, GS_PAD)
    idx = g[:, None] * GS + j[None, :]
    ok2 = (g[:, None] < G) & (j[None, :] < GS)
    c2 = _scores(tl.load(logits_ptr + idx, mask=ok2, other=0.0), row_max, row_sum, SOFTMAX)
    if HAS_BIAS:
        c2 += tl.load(bias_ptr + idx, mask=ok2, other=0.0)
    c2 = tl.where(ok2, c2, _NEG)
    first = tl.max(c2, axis=1)
    if SOFTMAX:
        score = tl.where(g < G, first, _NEG)
    else:
        best = tl.argmax(c2, axis=1)
        second = tl.max(tl.where(j[None, :] == best[:, None], _NEG, c2), axis=1)
        score = tl.where(g < G, first + second, _NEG)
    kept = tl.zeros([G_PAD], dtype=tl.int32)
    for _ in tl.static_range(TOPK_G):
        pick = tl.argmax(score, axis=0)
        kept = tl.where(g == pick, 1, kept)
        score = tl.where(g == pick, _NEG, score)
    group_of = e // GS
    return (tl.max(tl.where(g[None, :] == group_of[:, None], kept[None, :], 0), axis=1) > 0) & ok


@triton.jit
def _sigmoid_route(logits_ptr, bias_ptr, ids_ptr, w_ptr, E, GS, stride_l, stride_o, route_scale, norm_min, shared,
                   K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, G: tl.constexpr,
                   G_PAD: tl.constexpr, GS_PAD: tl.constexpr, TOPK_G: tl.constexpr, RENORM: tl.constexpr,
                   SHARED: tl.constexpr, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    row = logits_ptr + t * stride_l
    e = tl.arange(0, E_PAD)
    ok = e < E
    logits = tl.load(row + e, mask=ok, other=0.0)
    row_max = 0.0
    row_sum = 1.0
    if SOFTMAX:
        row_max = tl.max(tl.where(ok, logits, _NEG), axis=0)
        row_sum = tl.sum(tl.where(ok, tl.exp(logits - row_max), 0.0), axis=0)
    s = tl.where(ok, _scores(logits, row_max, row_sum, SOFTMAX), 0.0)
    choice = s
    if HAS_BIAS:
        choice += tl.load(bias_ptr + e, mask=ok, other=0.0)
    choice = tl.where(ok, choice, _NEG)
    if TOPK_G < G:
        kept = _kept_experts(row, bias_ptr, e, ok, E, GS, row_max, row_sum, G, G_PAD, GS_PAD, TOPK_G, SOFTMAX,
                             HAS_BIAS)
        choice = tl.where(kept, choice, _NEG)
    kk = tl.arange(0, K_PAD)
    ids = tl.zeros([K_PAD], dtype=tl.int32)
    ws = tl.zeros([K_PAD], dtype=tl.float32)
    for k in tl.static_range(K):
        pick = tl.argmax(choice, axis=0)
        ids = tl.where(kk == k, pick, ids)
        ws = tl.where(kk == k, tl.sum(tl.where(e == pick, s, 0.0), axis=0), ws)
        choice = tl.where(e == pick, _NEG, choice)
    if RENORM:
        ws = ws / (tl.maximum(tl.sum(ws, axis=0), norm_min) + 1e-20)
    ws = ws * route_scale
    if SHARED:
        ids = tl.where(kk == K, shared, ids)
        ws = tl.where(kk == K, 1.0, ws)
    out = kk < K + SHARED
    tl.store(ids_ptr + t * stride_o + kk, ids, mask=out)
    tl.store(w_ptr + t * stride_o + kk, ws, mask=out)


def sigmoid_route_triton(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool, n_group: int,
                         topk_group: int, scale: float, shared_id: int | None,
                         softmax: bool = False, norm_min: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32 → (ids [T, K(+1)] int32, weights [T, K(+1)] fp32); `bias` None: no
    selection bias; `softmax`: softmax scores and group ranking; `norm_min`: the renormalisation's
    least divisor."""
    T, E = logits.shape
    logits = logits.contiguous()
    bias = None if bias is None else bias.float().contiguous()
    width = top_k + (shared_id is not None)
    ids = torch.empty(T, width, dtype=torch.int32, device=logits.device)
    weights = torch.empty(T, width, dtype=torch.float32, device=logits.device)
    if T == 0:
        return ids, weights
    GS = E // n_group
    _sigmoid_route[(T,)](
        logits, logits if bias is None else bias, ids, weights, E, GS, logits.stride(0), width, float(scale),
        float(norm_min), -1 if shared_id is None else shared_id,
        K=top_k, K_PAD=triton.next_power_of_2(width), E_PAD=triton.next_power_of_2(E), G=n_group,
        G_PAD=triton.next_power_of_2(n_group), GS_PAD=triton.next_power_of_2(GS), TOPK_G=topk_group,
        RENORM=renormalize, SHARED=int(shared_id is not None), SOFTMAX=softmax, HAS_BIAS=bias is not None,
        num_warps=1 if interpreting(logits) else 4,
    )
    return ids, weights
