"""Gated RMSNorm of the GDN output (Qwen3-Next / Qwen3.5): y = norm(o) * w * silu(z), per head
(Qwen3.8-Flash-Next may gate with sigmoid(z): its `output_gate_type`).

On CUDA (`use_triton`) one Triton kernel (`triton_ops/gated_norm.py`) with the reference's
cast order; its fp32 sum of squares may differ from torch's in the last bits, so the two
agree to one rounding of the dtype (as `norm_fused.py`'s norms do), not bitwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton


def gated_rms_norm_ref(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, activation: str = "silu"
) -> torch.Tensor:
    """x, gate [..., D] (D = the value head dim), weight [D]. Returns x's dtype.

    NOTE: transformers' cast order exactly (`Qwen3NextRMSNormGated`): statistics in fp32, the
    normalised x cast back to its dtype *before* the weight (a plain `w * x`, note: not 1 + w),
    then the gate's SiLU in fp32, one final cast. fla's fused norm skips the middle cast.
    """
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * x32.to(dtype)
    y = y * (F.silu(gate.float()) if activation == "silu" else torch.sigmoid(gate.float()))
    return y.to(dtype)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, activation: str = "silu"
) -> torch.Tensor:
    """Same contract as `gated_rms_norm_ref`; one row of D per program on CUDA (the reference
    launches a dozen small kernels)."""
    if not use_triton(x) or weight.dtype != x.dtype or gate.dtype != x.dtype:
        return gated_rms_norm_ref(x, gate, weight, eps, activation)
    from edgemoe.kernels.triton_ops.gated_norm import gated_rms_norm_triton

    return gated_rms_norm_triton(x, gate, weight, eps, activation)
