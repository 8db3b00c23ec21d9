"""Routed experts by slot over banks in any expert format (`edgemoe.quant`).

`moe_slots_parts(x, slot_ids, weights, parts, fmt, act, cells)` is `moe_experts.moe_slots`
with the banks given as a format's parts (`parts["gate_up"]`, `parts["gate_up_scale"]`,
… each [S, …]): unquantised banks take `moe_slots` unchanged; quantised ones take the
reference below (each used slot dequantised to fp32, cast to x's dtype, then the plain
expert MLP), which the fused kernels (`moe_quant_fused.py`, CUDA) are tested against.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.moe_experts import Activation, expert_mlp, moe_slots
from edgemoe.quant import ExpertFormat, Parts, dequantise_expert


def slot_expert(parts: Parts, slot: int) -> Parts:
    return {name: t[slot] for name, t in parts.items()}


def moe_slots_quant_ref(
    x: torch.Tensor,  # [T, H]
    slot_ids: torch.Tensor,  # [T, K] int, -1 = leave the cell alone
    weights: torch.Tensor,  # [T, K]
    parts: Parts,  # the format's banks, each [S, ...]
    fmt: ExpertFormat,
    act: Activation,
    cells: torch.Tensor,  # [T, K, H] float32
) -> None:
    """The dequantise-first reference; one host sync (the distinct slots). Each slot's
    tokens in (t, k) order, as `moe_experts_partial_ref`."""
    hidden, inter = x.shape[1], parts["gate_up"].shape[1] // 2  # gate_up data rows: [S, 2I, ...]
    for slot in torch.unique(slot_ids[slot_ids >= 0]).tolist():
        gate_up, down = dequantise_expert(fmt, slot_expert(parts, slot), hidden, inter)
        t_idx, k_idx = torch.where(slot_ids == slot)
        y = expert_mlp(x[t_idx], gate_up.to(x.dtype), down.to(x.dtype), act)
        cells[t_idx, k_idx] = y.float() * weights[t_idx, k_idx, None].float()


def moe_slots_parts(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, parts: Parts, fmt: ExpertFormat,
    act: Activation, cells: torch.Tensor,
) -> None:
    """Fill cells[t, k] for every pair with slot_ids[t, k] >= 0 from banks in `fmt`."""
    if not fmt.quantised:
        moe_slots(x, slot_ids, weights, parts["gate_up"], parts["down"], act, cells)
        return
    moe_slots_quant_ref(x, slot_ids, weights, parts, fmt, act, cells)
