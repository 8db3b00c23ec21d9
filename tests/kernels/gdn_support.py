"""Inputs shaped the way the GDN layer produces them, and the fp32 tolerance of the recurrence."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

EPS32 = torch.finfo(torch.float32).eps


class GdnInputs(NamedTuple):
    q: torch.Tensor  # [T, Hk, Dk]
    k: torch.Tensor  # [T, Hk, Dk]
    v: torch.Tensor  # [T, Hv, Dv]
    g: torch.Tensor  # [T, Hv] fp32, ≤ 0
    beta: torch.Tensor  # [T, Hv] in (0, 1)
    cu_seqlens: torch.Tensor  # [B+1] int32
    states: torch.Tensor  # [B, Hv, Dk, Dv] fp32 initial states


def gdn_inputs(
    lens: list[int], hk: int, hv: int, dk: int, dv: int, seed: int, device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> GdnInputs:
    """As the model makes them: g = -exp(A_log)·softplus(a + dt_bias) ≤ 0, beta = sigmoid(b);
    A = exp(A_log) drawn from transformers' init range [0.01, 16]; states of a unit scale."""
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    a_decay = torch.empty(hv).uniform_(0.01, 16, generator=gen)
    g = -a_decay * F.softplus(rand(tokens, hv) - 4.0)  # dt_bias −4: decays mostly mild, some strong
    beta = torch.sigmoid(rand(tokens, hv))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    move = dict(device=device)
    return GdnInputs(
        rand(tokens, hk, dk).to(dtype=dtype, **move), rand(tokens, hk, dk).to(dtype=dtype, **move),
        rand(tokens, hv, dv).to(dtype=dtype, **move), g.to(**move), beta.to(dtype=dtype, **move),
        cu.to(**move), (rand(len(lens), hv, dk, dv) * 0.5).to(**move),
    )


def recurrence_atol(seq_len: int, dk: int, *refs: torch.Tensor) -> float:
    """Bound on |a - b| for two fp32 evaluations of the same gated delta recurrence.

    Each state entry accumulates ≤ seq_len rounded updates and each read is a Dk-term dot
    product, so each evaluation is within γ_n·M of the exact value (n = seq_len + Dk, γ_n ≈ n·eps,
    M the magnitude of the terms: the largest state / output entry, at least 1 since v ~ N(0, 1)
    is written into the state). Two evaluations: twice that. A wrong rule errs by O(M).
    """
    magnitude = max([1.0] + [r.abs().max().item() for r in refs])
    return 2 * (seq_len + dk) * EPS32 * magnitude
