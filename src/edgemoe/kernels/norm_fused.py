"""RMSNorm, and the residual add fused in front of it.

`add_rms_norm(x, residual, weight, eps, weight_offset)` returns (normed, new_residual)
with new_residual = residual + x rounded to the dtype (torch's `h + out`) and normed
the RMSNorm of new_residual, exactly as transformers computes it:
- weight_offset == 0 (Llama/Qwen3 `RMSNorm`): fp32 statistics, x * rsqrt(mean(x^2) + eps)
  cast to the dtype, then * weight in the dtype;
- weight_offset != 0 (Qwen3-Next / Qwen3.5 `x * (1 + w)` norms): the fp32 normalised x
  * (weight_offset + float(weight)) in fp32, cast to the dtype once.
The fast path's fp32 sum of squares may differ from torch's in its last bits, so the
two agree to one rounding of the dtype, not bitwise; new_residual is bitwise equal.
"""

from __future__ import annotations

from typing import Protocol

import torch

from edgemoe.kernels.backend import use_triton


class RowNorm(Protocol):
    """An RMSNorm's parameters (`layers/norm.py`'s RMSNorm has them): what a kernel that
    fuses the norm into its own output (`moe_experts.moe_combine_norm`) needs."""

    weight: torch.Tensor
    eps: float
    weight_offset: float


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """Over the last dim of x [..., N]; weight [N]."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight_offset == 0.0:
        return weight * x32.to(dtype)
    return (x32 * (weight_offset + weight.float())).to(dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x); x, residual [..., N] in one dtype."""
    new_residual = residual + x
    return rms_norm_ref(new_residual, weight, eps, weight_offset), new_residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """Same contract as `rms_norm_ref`; one row per program on CUDA."""
    if not use_triton(x) or weight.dtype != x.dtype:
        return rms_norm_ref(x, weight, eps, weight_offset)
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton

    return rms_norm_triton(x, None, weight, eps, weight_offset)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `add_rms_norm_ref`; one fused kernel on CUDA."""
    if not use_triton(x) or weight.dtype != x.dtype or residual.dtype != x.dtype:
        return add_rms_norm_ref(x, residual, weight, eps, weight_offset)
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton

    normed, new_residual = rms_norm_triton(x, residual, weight, eps, weight_offset)
    assert new_residual is not None
    return normed, new_residual


def grouped_rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, group: int, weight_offset: float = 1.0
) -> torch.Tensor:
    """RMSNorm of each `group`-wide slice of x [..., G·group] on its own, with a weight [G·group]
    of its own per slice (Qwen3.8-Flash-Next's `Qwen4ExpTextRMSNorm(group_size=...)` over the
    hyper-connection streams: zero-centred, weight_offset 1). `rms_norm_ref`'s cast order."""
    shape, groups = x.shape, x.shape[-1] // group
    normed = rms_norm_ref(x.reshape(*shape[:-1], groups, group), weight.view(groups, group), eps, weight_offset)
    return normed.reshape(shape)


def grouped_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, group: int, weight_offset: float = 1.0
) -> torch.Tensor:
    """Same contract as `grouped_rms_norm_ref`; one launch on CUDA for 2-D zero-centred rows
    (the hyper-connections' norm kernel, `triton_ops/hyper_connection.py`): to one rounding
    of the dtype, as `rms_norm`."""
    if not (use_triton(x) and x.dim() == 2 and weight.dtype == x.dtype and weight_offset == 1.0):
        return grouped_rms_norm_ref(x, weight, eps, group, weight_offset)
    from edgemoe.kernels.triton_ops.hyper_connection import hc_norm_triton

    return hc_norm_triton(x, weight, eps, group, None)[0]


def check_head_norms(q_norm_w: torch.Tensor | None, k_norm_w: torch.Tensor | None, head_dim: int) -> bool:
    """Whether head norms are given; they come together, each [head_dim]."""
    if (q_norm_w is None) != (k_norm_w is None):
        raise ValueError("q_norm_w and k_norm_w are given together or not at all")
    if q_norm_w is None or k_norm_w is None:
        return False
    if q_norm_w.shape != (head_dim,) or k_norm_w.shape != (head_dim,):
        raise ValueError(f"head norm weights must be [{head_dim}]; got {tuple(q_norm_w.shape)}, {tuple(k_norm_w.shape)}")
    return True
