"""INT4 weights, group-wise along K with fp16 scales and 4-bit zero points.

W[r, k] ≈ (q[r, k] - zero[r, g]) * scale[r, g] with g = k // group, q and zero in
[0, 15]. Two nibbles per byte along K: byte j of a row holds q[2j] (low) and q[2j+1]
(high), the row padded to an even length. One layout for every 4-bit source: AWQ and
GPTQ (asymmetric, their own zero points) and compressed-tensors (symmetric: zero 8)
repack into it losslessly, and load-time quantisation writes it symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from edgemoe.quant.formats import ExpertFormat, Parts, PartSpec, cdiv

SYM_ZERO = 8  # symmetric: q - 8 in [-8, 7]
SYM_MAX = 7


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values in [0, 15] → uint8 [N, ceil(K/2)] (even k in the low nibble)."""
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = F.pad(q, (0, 1))
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """uint8 [N, ceil(K/2)] → uint8 [N, K]."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack([lo, hi], dim=-1).view(packed.shape[0], -1)[:, :cols]


def fp16_scale_at_least(x: torch.Tensor) -> torch.Tensor:
    """The smallest fp16 >= x (x > 0, fp32): so that |w| / scale never exceeds the grid."""
    s = x.to(torch.float16)
    low = s.float() < x
    return torch.where(low, (s.view(torch.int16) + 1).view(torch.float16), s)


@dataclass(frozen=True)
class Int4Group(ExpertFormat):
    group: int = 128
    name: ClassVar[str] = "int4"

    def matrix_specs(self, rows: int, cols: int) -> dict[str, PartSpec]:
        g = cdiv(cols, self.group)
        return {"": ((rows, cdiv(cols, 2)), torch.uint8), "_scale": ((rows, g), torch.float16),
                "_zero": ((rows, g), torch.uint8)}

    def _groups(self, w: torch.Tensor) -> torch.Tensor:
        """[N, K] → [N, G, width] zero-padded: width the group, or K when one group holds
        the row (a row-wide group, GPTQ's group_size -1, is never padded to its nominal size)."""
        n, k = w.shape
        g = cdiv(k, self.group)
        width = self.group if g > 1 else k
        return F.pad(w.float(), (0, g * width - k)).view(n, g, width)

    def scales(self, w: torch.Tensor) -> torch.Tensor:
        amax = self._groups(w).abs().amax(dim=2)
        return torch.where(amax > 0, fp16_scale_at_least(amax / SYM_MAX), torch.ones_like(amax, dtype=torch.float16))

    def quantise(self, w: torch.Tensor) -> Parts:
        """Symmetric: zero 8, scale = the group's largest |w| / 7 rounded up to fp16."""
        n, k = w.shape
        scale = self.scales(w)
        q = torch.round(self._groups(w) / scale.float()[:, :, None]).clamp(-8, SYM_MAX) + SYM_ZERO
        return {"": pack_nibbles(q.view(n, -1)[:, :k]), "_scale": scale,
                "_zero": torch.full_like(scale, SYM_ZERO, dtype=torch.uint8)}

    def dequantise(self, parts: Parts, rows: int, cols: int, halves: int = 1) -> torch.Tensor:
        q = unpack_nibbles(parts[""], cols).float()
        g = torch.arange(cols, device=q.device) // self.group
        return (q - parts["_zero"].float()[:, g]) * parts["_scale"].float()[:, g]

    def error_bound(self, w: torch.Tensor) -> torch.Tensor:
        g = torch.arange(w.shape[1]) // self.group
        # Half a step, plus the fp32 rounding of w / scale (2^-24 of up to 8 steps).
        return (0.5 + 8 * 2.0**-23) * self.scales(w).float()[:, g]

    @property
    def label(self) -> str:
        return f"int4 (group {self.group})"
