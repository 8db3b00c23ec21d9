"""Dense gated MLP (for the non-MoE layers of a MoE model)."""

from __future__ import annotations

import torch

from edgemoe.kernels.moe_experts import Activation, expert_mlp


class DenseMLP:
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, act: Activation) -> None:
        self.gate_up = gate_up  # [2I, H]
        self.down = down  # [H, I]
        self.act = act

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return expert_mlp(x, self.gate_up, self.down, self.act)
