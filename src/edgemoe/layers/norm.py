"""RMSNorm layer."""

from __future__ import annotations

import torch

from edgemoe.kernels.rmsnorm import rms_norm, rms_norm_scaled


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class OffsetRMSNorm:
    """The zero-centred RMSNorm of Qwen3-Next / Qwen3.5: x·(1 + w), the scale applied in fp32."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        # NOTE: 1 + w in fp32 once, the value transformers computes on every call.
        self.scale = 1.0 + weight.float()
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_scaled(x, self.scale, self.eps)
