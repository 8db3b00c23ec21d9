"""RMSNorm layer."""

from __future__ import annotations

import torch

from edgemoe.kernels.rmsnorm import rms_norm


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
