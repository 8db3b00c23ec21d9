"""Sigmoid routing with a selection bias and group-limited top-k (GLM-4.5 and later,
DeepSeek-V3): the reference is transformers' `Glm4MoeTopkRouter`. Also its softmax mode
(`GroupedSigmoid.softmax`, DeepSeek-V2's `DeepseekV2TopkRouter`), described after.

    s = sigmoid(x · Wᵀ)              scores, fp32 (x and W upcast, as transformers does)
    c = s + b                        the choice scores (b: `e_score_correction_bias`, fp32)
    groups of E / n_group experts ranked by the sum of their two best c; only the experts
    of the best `topk_group` groups compete, the others at -inf
    ids = top-k of c;  w = s[ids], divided by their sum (+1e-20) when renormalised, × scale

The weights stay fp32 (transformers multiplies the experts' outputs by them in fp32), not
rounded to the activations' dtype as the softmax router's are. The bias only chooses: the
weights are the plain scores. On a GPU (bf16 / fp16 activations) the logits are one fp32
GEMM, of a fixed shape for decode batches (`router_logits`), and the rest one Triton launch
(`triton_ops/router_sigmoid.py`, the shared expert's pair appended there too); elsewhere
these torch ops. A CUDA graph captures either.

The softmax mode (DeepSeek-V2 / V2.5, `topk_method` greedy or group_limited_greedy): the
same fp32 logits, weights and scale, but s = softmax(x · Wᵀ), no selection bias (c = s), and
a group ranked by its best score (a group of one is fine). transformers zeroes the
discarded groups' scores where we put -inf: the same choice while the kept groups hold
top_k experts (`check`) of scores > 0.

The softmax mode with a selection bias (ERNIE-4.5's `Ernie4_5_MoeTopKRouter`): c = s + b,
one group, the chosen plain softmax scores renormalised by max(Σ, `norm_min`) (transformers'
clamp at `moe_norm_min`). NOTE: the renormalisation divides by max(Σ, norm_min) + 1e-20
in every mode; with norm_min = 0 that is GLM's Σ + 1e-20, and with ERNIE's 1e-12 the 1e-20
is under half an ulp of anything >= 1e-12 in fp32, so the division is transformers' bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.kernels.backend import use_triton
from edgemoe.kernels.dense_gemv import MAX_TOKENS

FIXED_ROWS = MAX_TOKENS  # decode batches' logits from one GEMM shape on a GPU (`router_logits`)


@dataclass(frozen=True)
class GroupedSigmoid:
    """The routing settings a config names: `n_group`, `topk_group`, `routed_scaling_factor`;
    `softmax`: softmax scores (a group ranked by its best); `selection_bias`: the router has an
    `e_score_correction_bias` (GLM, DeepSeek-V3, MiniMax, ERNIE; not DeepSeek-V2); `norm_min`:
    the renormalisation's least divisor (ERNIE's `moe_norm_min`; 0: none)."""

    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0
    softmax: bool = False
    selection_bias: bool = True
    norm_min: float = 0.0

    def check(self, experts: int, top_k: int) -> str | None:
        """Why this routing can't pick `top_k` of `experts` (None: it can). transformers
        would fail on an uneven split or a group of one (its two-best sum), and would pick
        -inf experts where the kept groups hold fewer than top_k (softmax: a group of one
        is fine, its best score is its only one)."""
        smallest = 1 if self.softmax else 2
        if experts % self.n_group or experts // self.n_group < smallest:
            what = "evenly" if self.softmax else "into groups of two or more"
            return f"n_group={self.n_group} does not split {experts} experts {what}"
        if not 1 <= self.topk_group <= self.n_group:
            return f"topk_group={self.topk_group} is not between 1 and n_group={self.n_group}"
        if top_k > self.topk_group * (experts // self.n_group):
            return f"num_experts_per_tok={top_k} is more than the {self.topk_group} kept group(s) hold"
        return None


@dataclass(frozen=True)
class SigmoidRouter:
    """One layer's sigmoid router: its weight [E, H] and selection bias [E] (None: none, the
    softmax mode's), both fp32; `shared_id`: the bank's shared expert, routed by every token
    with weight 1 after the routed pairs (`with_shared`; None: no shared expert in the bank)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    spec: GroupedSigmoid
    shared_id: int | None = None


def with_shared(ids: torch.Tensor, weights: torch.Tensor, shared_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] → [T, K+1]: the shared expert's pair appended, weight 1 (GLM adds its output
    unscaled after the routed sum; the executor's fixed-order k-sum adds it last)."""
    if shared_id is None:
        return ids, weights
    T = ids.shape[0]
    return torch.cat([ids, ids.new_full((T, 1), shared_id)], 1), torch.cat([weights, weights.new_ones(T, 1)], 1)


def route_grouped_sigmoid(
    x: torch.Tensor, router: SigmoidRouter, top_k: int, renormalize: bool, shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] → (ids [T, K] int32, weights [T, K] fp32); `shared`: with the router's
    shared pair appended ([T, K+1], `with_shared`)."""
    logits = router_logits(x, router.weight, FIXED_ROWS if x.is_cuda else 0)  # [T, E] fp32
    spec, shared_id = router.spec, router.shared_id if shared else None
    if use_triton(x):
        from edgemoe.kernels.triton_ops.router_sigmoid import sigmoid_route_triton

        return sigmoid_route_triton(logits, router.bias, top_k, renormalize, spec.n_group, spec.topk_group,
                                    spec.scale, shared_id, softmax=spec.softmax, norm_min=spec.norm_min)
    return with_shared(*route_scores_ref(logits, router, top_k, renormalize), shared_id)


def router_logits(x: torch.Tensor, weight: torch.Tensor, fixed_rows: int = 0) -> torch.Tensor:
    """x [T, H] → fp32 logits [T, E]. A batch of at most `fixed_rows` rows must not depend on
    its size (a token's logits, so its route, independent of its batch, as the softmax
    router's fused launch): on a GPU with Triton the dense GEMV (batch-invariant by
    construction; fp32 products and sums of the exactly upcast x, one launch where the
    padded GEMM took four: a fill, a copy, cuBLAS's SIMT sgemm and its split-K reduce, ~12 µs
    a layer on an H100, 2026-12-06), else the batch zero-padded to `fixed_rows` so cuBLAS
    sees one shape. Longer prompt chunks take their own shape, as the softmax router's do."""
    T = x.shape[0]
    if not 0 < T <= fixed_rows:
        return torch.nn.functional.linear(x.float(), weight.float())
    if T <= MAX_TOKENS and weight.dtype == torch.float32 and use_triton(x):
        from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

        return dense_gemv_triton(x, weight, out_dtype=torch.float32)
    padded = x.new_zeros((fixed_rows, x.shape[1]), dtype=torch.float32)
    padded[:T] = x
    return torch.nn.functional.linear(padded, weight.float())[:T]


def route_scores_ref(
    logits: torch.Tensor, router: SigmoidRouter, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing from fp32 logits [T, E], as transformers' router does it."""
    spec = router.spec
    scores = torch.softmax(logits, dim=-1) if spec.softmax else torch.sigmoid(logits)
    choice = scores if router.bias is None else scores + router.bias
    T, E = scores.shape
    if spec.topk_group < spec.n_group:  # the whole-group case is the mask's identity: skipped
        choice = _kept_groups(choice, spec, T, E)
    ids = torch.topk(choice, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:  # the module docstring's NOTE: transformers' clamp (ERNIE) or + 1e-20 (GLM), both exact
        weights = weights / (weights.sum(dim=-1, keepdim=True).clamp(min=spec.norm_min) + 1e-20)
    return ids.to(torch.int32), weights * spec.scale


def _kept_groups(choice: torch.Tensor, spec: GroupedSigmoid, T: int, E: int) -> torch.Tensor:
    """`choice` with the experts outside the best `topk_group` groups at -inf; a group ranks
    by its two best choice scores summed (softmax: by its best)."""
    grouped = choice.view(T, spec.n_group, E // spec.n_group)
    if spec.softmax:
        group_scores = grouped.amax(dim=-1)  # [T, n_group]
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best = torch.topk(group_scores, spec.topk_group, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(T, E)
