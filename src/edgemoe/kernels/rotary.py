"""Rotary position embedding (the rotate-half convention of Llama/Qwen), full or partial."""

from __future__ import annotations

import torch


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for `positions` [T] → two [T, R] tensors in `dtype` (R = 2 × inv_freq)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, R/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, R]
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def rope_table(num_positions: int, inv_freq: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [P, R/2] fp32 for positions 0..P-1: the half-width table (the rotate-half
    layout repeats it), computed as `rope_cos_sin` computes each entry."""
    positions = torch.arange(num_positions, device=inv_freq.device)
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [P, R/2]
    return freqs.cos() * scaling, freqs.sin() * scaling


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, R] with R <= D: the first R dims of each head rotate,
    the other D - R pass unchanged (partial rotary)."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)


apply_rope = apply_rope_ref
