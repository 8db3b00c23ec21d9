"""Rotary position embedding tables: default RoPE, linear and YaRN scaling, dynamic NTK
within the native length, and partial rotary (only the first `rotary_dim` dims of a head
rotate).

The inverse frequencies and the attention factor are computed expression for expression
as transformers 5.24 computes them (`modeling_rope_utils.ROPE_INIT_FUNCTIONS` and the
models' `compute_default_rope_parameters`), so cos/sin match its tables bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edgemoe.kernels.rotary import rope_cos_sin, rope_table

ROPE_TYPES = ("default", "linear", "dynamic", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """RoPE as a config.json describes it, after transformers' standardisation
    (`rope_parameters` with `rope_theta`, `partial_rotary_factor` and yarn's
    `original_max_position_embeddings` filled in). Unset yarn fields are None, as there."""

    head_dim: int
    theta: float
    rotary_dim: int  # the first rotary_dim dims of each head rotate; the rest pass unchanged
    rope_type: str = "default"  # one of ROPE_TYPES
    factor: float | None = None  # linear, dynamic, yarn (yarn: None = max_pos / original)
    max_position_embeddings: int | None = None  # config.json's, unscaled (yarn with factor None)
    original_max_position_embeddings: int | None = None  # yarn
    attention_factor: float | None = None  # yarn: cos/sin multiplier; None = from factor/mscale
    beta_fast: float | None = None  # yarn: None = 32
    beta_slow: float | None = None  # yarn: None = 1
    mscale: float | None = None  # yarn (DeepSeek)
    mscale_all_dim: float | None = None  # yarn (DeepSeek)
    truncate: bool = True  # yarn: round the correction range outwards


def _arange_exponent(dim: int) -> torch.Tensor:
    return torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim


def _default(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    return 1.0 / (spec.theta ** _arange_exponent(spec.rotary_dim)), 1.0


def _linear(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    inv_freq, _ = _default(spec)
    inv_freq /= spec.factor  # NOTE: in place after the division, as transformers does it
    return inv_freq, 1.0


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(spec: RopeSpec, factor: float) -> float:
    if spec.attention_factor is not None:
        return spec.attention_factor
    if spec.mscale and spec.mscale_all_dim:
        return float(_yarn_mscale(factor, spec.mscale) / _yarn_mscale(factor, spec.mscale_all_dim))
    return _yarn_mscale(factor)


def _yarn_correction_range(spec: RopeSpec, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """The dimension range between pure extrapolation and pure interpolation."""
    dim, base, original = spec.rotary_dim, spec.theta, spec.original_max_position_embeddings
    assert original is not None

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    dim, original = spec.rotary_dim, spec.original_max_position_embeddings
    assert original is not None and spec.max_position_embeddings is not None
    factor = spec.factor if spec.factor is not None else spec.max_position_embeddings / original
    attention_factor = _yarn_attention_factor(spec, factor)
    low, high = _yarn_correction_range(spec, spec.beta_fast or 32, spec.beta_slow or 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = spec.theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1 where a dim keeps its frequency, 0 where it is interpolated
    inv_freq = inv_freq_interpolation * (1 - extrapolation) + inv_freq_extrapolation * extrapolation
    return inv_freq, attention_factor


def _dynamic(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    """Dynamic NTK at its initial length, max_position_embeddings (the base stays theta
    up to rounding, reproduced here)."""
    # NOTE: transformers recomputes these frequencies once a forward's longest sequence
    # passes max_position_embeddings (per batch, keeping earlier keys as they were), so
    # the context length is capped there (models/hf_config.py) and this stays exact.
    dim, seq_len = spec.rotary_dim, spec.max_position_embeddings
    assert spec.factor is not None and seq_len is not None
    base = spec.theta * ((spec.factor * seq_len / seq_len) - (spec.factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** _arange_exponent(dim)), 1.0


_INIT = {"default": _default, "linear": _linear, "dynamic": _dynamic, "yarn": _yarn}


def rope_inv_freq(spec: RopeSpec) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] fp32 on the CPU, attention factor)."""
    return _INIT[spec.rope_type](spec)


class Rotary:
    """A model's RoPE: cos/sin for given positions, or the whole table by position."""

    def __init__(self, spec: RopeSpec, device: torch.device) -> None:
        inv_freq, self.attention_factor = rope_inv_freq(spec)
        self.spec = spec
        self.inv_freq = inv_freq.to(device)  # [R/2]
        self.rotary_dim = 2 * inv_freq.numel()  # R: cos/sin width; head dims past it pass

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, R] in `dtype` for `positions` [T] (rotate-half layout)."""
        return rope_cos_sin(positions, self.inv_freq, self.attention_factor, dtype)

    def cos_sin_table(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [num_positions, R/2] fp32, row p for position p, attention factor
        applied: what a kernel indexing by position reads (column j pairs dims j, j + R/2)."""
        return rope_table(num_positions, self.inv_freq, self.attention_factor)
