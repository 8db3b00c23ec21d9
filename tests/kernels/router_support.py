"""Inputs and checks for the fused router's tests (CPU interpreter and GPU): routing from
logits computed two ways is compared within the logits' rounding bound."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tolerances import eps, rounding_atol, sum_atol

from edgemoe.kernels.router import route_logits_topk_ref


def router_inputs(
    T: int, E: int, H: int, dtype: torch.dtype, seed: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states ~ N(0, 1) and a router whose logits are ~ N(0, 1), as a trained one's."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(T, H, generator=g), torch.randn(E, H, generator=g) / H**0.5
    return x.to(device, dtype), w.to(device, dtype)


def planted(T: int, E: int, H: int, seed: int, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """(x, w, L): bf16 inputs whose H-term dot products are exact in any order, with
    distinct planted logits L [T, E] (a permutation of -E/2..E/2-1, times 2^-4; needs
    E <= 128, T <= H): token t's x is 2^-4 on its own block of H // T hidden units and 0
    elsewhere; there, w[e] holds small integers summing to L[t, e] (L, then zero-sum
    noise in ±3, shuffled). Every partial sum is an integer far below 2^24."""
    g = torch.Generator().manual_seed(seed)
    block, m = H // T, (H // T - 1) // 2
    x, w = torch.zeros(T, H), torch.zeros(E, H)
    L = torch.stack([torch.randperm(E, generator=g) - E // 2 for _ in range(T)]).float()  # [T, E]
    for t in range(T):
        x[t, t * block:(t + 1) * block] = 2.0**-4
        noise = torch.randint(-3, 4, (E, m), generator=g).float()
        part = torch.cat([L[t, :, None], noise, -noise, torch.zeros(E, block - 1 - 2 * m)], dim=1)
        w[:, t * block:(t + 1) * block] = part[:, torch.randperm(block, generator=g)]
    return x.to(device, torch.bfloat16), w.to(device, torch.bfloat16), (L * 2.0**-4).to(device)


def logit_bound(x: torch.Tensor, w: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[T, E]: how far two evaluations of the logits may be apart. Both are H-term fp32
    dots (any order: s = 2γ_H·Σ|x·w| apart) each rounded once to x's dtype (u·|value| each;
    one value within s of the other, within u of its rounding): (1+u)·s + 2u·|ℓ|·(1+eps)."""
    u = eps(x.dtype) / 2
    s = sum_atol(torch.float32, x.shape[1], 1.0) * (x.float().abs() @ w.float().abs().T)
    return (1 + u) * s + rounding_atol(x.dtype, 1, 1.0) * logits.float().abs() * (1 + eps(x.dtype))


def check_routing(
    x: torch.Tensor, w: torch.Tensor, k: int, renorm: bool, ids: torch.Tensor, weights: torch.Tensor
) -> None:
    """ids: the reference's, except where its j-th and the kernel's j-th expert have logits
    within twice the bound (order statistics move at most as far as the values do); the
    weights: the reference formula (fp64) at the kernel's ids, off by the logits' bound."""
    ref = F.linear(x, w).double()  # [T, E]: the reference's logits
    want_ids, _ = route_logits_topk_ref(x, w, k, renorm, x.dtype)
    delta = logit_bound(x, w, ref).amax(dim=1, keepdim=True).double()  # [T, 1]
    assert ids.dtype == torch.int32 and ((ids >= 0) & (ids < w.shape[0])).all()
    assert all(len(set(row.tolist())) == k for row in ids)  # K distinct experts per token
    same = ids == want_ids
    near = (ref.gather(1, ids.long()) - ref.gather(1, want_ids.long())).abs() <= 2 * delta
    assert (same | near).all(), (ids[~(same | near)], want_ids[~(same | near)])
    # A token whose top K+1 logits are further apart than 2·delta has exactly those ids.
    top = ref.topk(k + 1, dim=1).values
    clear = ((top[:, :-1] - top[:, 1:]) > 2 * delta).all(dim=1)
    assert (ids[clear] == want_ids[clear]).all()
    e = torch.exp(ref - ref.amax(dim=1, keepdim=True))
    chosen = e.gather(1, ids.long())
    want_w = chosen / (chosen.sum(1, keepdim=True) if renorm else e.sum(1, keepdim=True))
    # Every logit off by <= delta moves a softmax ratio by a factor within e^(±2δ); the
    # fp32 softmax sums <= E + K terms (γ); one rounding to x's dtype (2u covers it).
    rel = torch.expm1(2 * delta) + sum_atol(torch.float32, w.shape[0] + k, 1.0) + eps(x.dtype)
    assert ((weights.double() - want_w).abs() <= rel * want_w).all()


def tied_logits(T: int, E: int, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """[T, E] fp32 logits from a few levels 0.5 apart (many exact ties, no near ones: p
    differs by a factor e^0.5 between levels), with -inf and -150 (p underflows to 0, a
    tie with -inf) sprinkled in; the last row keeps only 2 finite levels, so a top-8
    takes 6 of the zero-probability experts (by lowest id)."""
    g = torch.Generator().manual_seed(seed)
    x = -0.5 * torch.randint(0, 6, (T, E), generator=g).float()
    u = torch.rand(T, E, generator=g)
    x[u < 0.1] = float("-inf")
    x[(u >= 0.1) & (u < 0.2)] = -150.0
    x[-1] = float("-inf")
    x[-1, torch.randperm(E, generator=g)[:2]] = torch.tensor([0.0, -1.0])
    x[-1, torch.randperm(E, generator=g)[:3]] = -150.0
    return x.to(device)


def sorted_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The K experts of highest probability, ties to the lower id: a stable sort."""
    p = torch.softmax(logits.float(), dim=-1)
    return torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k].int()
