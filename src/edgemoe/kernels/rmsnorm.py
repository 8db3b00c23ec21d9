"""RMSNorm: y = w * x / sqrt(mean(x^2) + eps), statistics in float32."""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # NOTE: matches transformers' order exactly: normalise in fp32, cast back, then scale.
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


rms_norm = rms_norm_ref
