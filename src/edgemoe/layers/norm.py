"""RMSNorm layer."""

from __future__ import annotations

import torch

from edgemoe.kernels.norm_fused import add_rms_norm, rms_norm


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the residual add fused with this norm."""
        return add_rms_norm(x, residual, self.weight, self.eps)
