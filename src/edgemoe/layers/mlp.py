"""Dense gated MLP (for the non-MoE layers of a MoE model)."""

from __future__ import annotations

import torch

from edgemoe.kernels.activations import Activation, activation  # noqa: F401 - re-exported
from edgemoe.kernels.moe_experts import expert_mlp


class DenseMLP:
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, act: Activation) -> None:
        self.gate_up = gate_up  # [2I, H]
        self.down = down  # [H, I]
        self.act = act

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, num_decode: int = 0, num_padding: int = 0
    ) -> torch.Tensor:
        out = expert_mlp(x, self.gate_up, self.down, self.act)
        return out if residual is None else residual + out
