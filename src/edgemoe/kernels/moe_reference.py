"""The torch references of the routed experts (`moe_experts.py` dispatches, `moe_fused.py`
and the CPU kernel are tested against these): one expert's MLP, the plain per-expert
reference in expert ids, and the fixed-order combine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from edgemoe.kernels.cell_sources import CellSources, apply_sources

Activation = Callable[[torch.Tensor], torch.Tensor]  # plain functions take the torch path


def expert_mlp(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Activation
) -> torch.Tensor:
    """One expert on its tokens: x [n, H], gate_up [2I, H], down [H, I] → [n, H]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act(gate) * up, down)


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
) -> None:
    """The plain reference in expert ids: fill contrib[t, k] for every (t, k) routed to
    one of `experts`, whose weights are bank rows `rows`; each expert's tokens in (t, k)
    order. The slot kernels and the CPU kernel are tested against it."""
    for expert, row in zip(experts, rows, strict=True):
        token_idx, k_idx = torch.where(topk_ids == expert)
        if token_idx.numel() == 0:
            continue
        y = expert_mlp(x[token_idx], gate_up[row], down[row], act)  # [n, H]
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
