"""Dense gated MLP (for the non-MoE layers of a MoE model) and activations by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.kernels.moe_experts import Activation, expert_mlp

ACTIVATIONS: dict[str, Activation] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str) -> Activation:
    """The activation a config's `hidden_act` names; ValueError naming the supported ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class DenseMLP:
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, act: Activation) -> None:
        self.gate_up = gate_up  # [2I, H]
        self.down = down  # [H, I]
        self.act = act

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        out = expert_mlp(x, self.gate_up, self.down, self.act)
        return out if residual is None else residual + out
