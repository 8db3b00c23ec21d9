"""The torch references of the routed experts (`moe_experts.py` dispatches, `moe_fused.py`
and the CPU kernel are tested against these): one expert's MLP, the plain per-expert
reference in expert ids, and the fixed-order combine.

Rounding points (the fast kernels round where these do): each projection's output in the
weights' dtype; without biases the activation's own (`Activation.glu`: silu and the
product each round); with biases (`ExpertBias`, gpt-oss) the bias is added in fp32 to the
rounded projection, the GLU is computed in fp32 and h rounded once to the dtype, and the
down bias is added in fp32 to the rounded down projection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from edgemoe.kernels.activations import glu
from edgemoe.kernels.cell_sources import CellSources, apply_sources
from edgemoe.kernels.expert_bias import ExpertBias

Activation = Callable[[torch.Tensor], torch.Tensor]  # plain functions take the torch path


def expert_mlp(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Activation, bias: ExpertBias | None = None
) -> torch.Tensor:
    """One expert on its tokens: x [n, H], gate_up [2I, H], down [H, I] → [n, H] (in x's
    dtype; fp32 with biases). `bias`: this expert's ([2I], [H]) or each token's ([n, 2I],
    [n, H]) biases."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    if bias is not None:
        gate_bias, up_bias = bias.gate_up.float().chunk(2, dim=-1)
        gate, up = gate.float() + gate_bias, up.float() + up_bias
    y = F.linear(glu(act, gate, up).to(down.dtype), down)  # NOTE: without bias the cast is a no-op
    return y if bias is None else y.float() + bias.down.float()


def moe_experts_partial_ref(
    x: torch.Tensor,
    topk_ids: torch.Tensor,  # [T, K] expert ids
    topk_weights: torch.Tensor,
    experts: Iterable[int],
    rows: Iterable[int],
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Activation,
    contrib: torch.Tensor,
    bias: ExpertBias | None = None,
    bias_ids: torch.Tensor | None = None,
) -> None:
    """The plain reference in expert ids: fill contrib[t, k] for every (t, k) routed to
    one of `experts`, whose weights are bank rows `rows`; each expert's tokens in (t, k)
    order. The slot kernels and the CPU kernel are tested against it. `bias` [E, …] is
    indexed by expert id: topk_ids' own, or `bias_ids` [T, K] where topk_ids holds slots."""
    ids = topk_ids if bias_ids is None else bias_ids
    for expert, row in zip(experts, rows, strict=True):
        token_idx, k_idx = torch.where(topk_ids == expert)
        if token_idx.numel() == 0:
            continue
        b = bias.take(ids[token_idx, k_idx]) if bias is not None else None
        y = expert_mlp(x[token_idx], gate_up[row], down[row], act, b)  # [n, H]
        contrib[token_idx, k_idx] = y.float() * topk_weights[token_idx, k_idx, None].float()


def moe_combine_ref(
    cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor | None = None,
    sources: CellSources | None = None,
) -> torch.Tensor:
    """cells [T, K, H] → [T, H]: the K contributions summed in fp32 in the order k = 0..K-1,
    rounded once to `dtype`, plus `residual` (in `dtype`, as the unfused `residual + out`);
    `sources` (`kernels/cell_sources.py`) written into `cells` first."""
    cells = apply_sources(cells, sources)
    acc = cells[:, 0].clone()
    for k in range(1, cells.shape[1]):
        acc += cells[:, k]
    out = acc.to(dtype)
    return out if residual is None else residual + out
