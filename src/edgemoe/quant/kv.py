"""The KV cache in fp8 (`--kv-cache-dtype fp8`): e4m3 values with one fp32 scale per
(token, kv head), the head vector's largest |x| / 448 — no calibration, and half the
bytes of bf16 (D + 4 bytes per head per token instead of 2·D).

`quantise_kv` is what every KV write does (the torch reference and the Triton rope+KV
kernel round the same way: x / scale rounded to nearest even); `dequantise_kv` is what
the attention references read; the Triton attention kernels fold the scales into the
scores and the probabilities instead.
"""

from __future__ import annotations

import torch

KV_FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
KV_DTYPES = ("auto", "fp8")


def quantise_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] → (e4m3 [..., D], fp32 scales [...])."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # NOTE: clamp before the cast: x / scale may round just past 448 (e4m3fn has no infinity).
    return (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(KV_FP8), scale


def dequantise_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(e4m3 [..., D], scales [...]) → [..., D] in `dtype` (via the exact fp32 product)."""
    return (q.float() * scale[..., None]).to(dtype)


def kv_element_bytes(kv_cache_dtype: str, dtype: torch.dtype, head_dim: int) -> float:
    """Bytes per stored element of K or V: the model dtype's, or fp8's plus its share of the scale."""
    return 1 + 4 / head_dim if kv_cache_dtype == "fp8" else dtype.itemsize
