"""Rotary embedding tables for a model (default RoPE; scaled variants raise clearly)."""

from __future__ import annotations

import torch

from edgemoe.kernels.rotary import rope_cos_sin


class Rotary:
    def __init__(self, head_dim: int, theta: float, device: torch.device) -> None:
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.inv_freq = (1.0 / (theta**exponent)).to(device)  # [D/2]
        self.scaling = 1.0

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq, self.scaling, dtype)
