"""Routed-expert compute: out[t] = sum_k w[t,k] * down(act(gate(x)) * up(x)) over the
experts chosen for token t.

The banks are addressed by *row*, so the same kernel runs on a full resident bank
(row = expert id) and on a slot cache (row = the expert's slot). Work is split in two
stages so that any partition of the experts (waves, CPU/GPU splits) gives
bitwise-identical results: `moe_experts_partial` writes each (token, k) contribution
into its own cell, and `moe_combine` sums the K cells in a fixed order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

Activation = Callable[[torch.Tensor], torch.Tensor]


def expert_mlp(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Activation
) -> torch.Tensor:
    """One expert on its tokens: x [n, H], gate_up [2I, H], down [H, I] → [n, H]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act(gate) * up, down)


def moe_experts_partial_ref(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Iterable[int],
    rows: Iterable[int],
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Activation,
    contrib: torch.Tensor,
) -> None:
    """Fill contrib[t, k] for every (t, k) routed to one of `experts`.

    x [T, H]; topk_ids, topk_weights [T, K]; `rows[i]` is the bank row holding
    `experts[i]`; gate_up [S, 2I, H]; down [S, H, I]; contrib [T, K, H] (float32).
    """
    for expert, row in zip(experts, rows, strict=True):
        token_idx, k_idx = torch.where(topk_ids == expert)
        if token_idx.numel() == 0:
            continue
        y = expert_mlp(x[token_idx], gate_up[row], down[row], act)  # [n, H]
        contrib[token_idx, k_idx] = y.float() * topk_weights[token_idx, k_idx, None].float()


def moe_combine_ref(contrib: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """contrib [T, K, H] → [T, H]: the K contributions summed in fp32, in a fixed order."""
    return contrib.sum(dim=1).to(dtype)


moe_experts_partial = moe_experts_partial_ref
moe_combine = moe_combine_ref
