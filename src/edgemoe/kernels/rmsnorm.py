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


def rms_norm_scaled_ref(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * scale with `scale` fp32, one cast at the end: the
    zero-centred norm of Qwen3-Next / Qwen3.5 (scale = 1 + w, computed in fp32).

    NOTE: transformers' order for these models (`Qwen3NextRMSNorm`): the scale multiplies
    in fp32 *before* the cast back, unlike `rms_norm_ref`."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * scale).to(x.dtype)


rms_norm_scaled = rms_norm_scaled_ref
