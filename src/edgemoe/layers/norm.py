"""RMSNorm layer."""

from __future__ import annotations

import torch

from edgemoe.kernels.norm_fused import add_rms_norm, rms_norm


class RMSNorm:
    """x · rsqrt(mean(x²) + eps), cast to the dtype, × weight (Llama/Qwen3 order)."""

    # 0: the plain norm; kernels that fuse a norm in (the rope + KV write) fuse only this one.
    weight_offset = 0.0

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.weight_offset)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the residual add fused with this norm."""
        return add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)


class OffsetRMSNorm(RMSNorm):
    """The zero-centred RMSNorm of Qwen3-Next / Qwen3.5: x·(1 + w), the scale computed and
    applied in fp32 before the cast back (`kernels/norm_fused.py`, weight_offset 1)."""

    weight_offset = 1.0
