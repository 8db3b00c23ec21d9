"""MXFP4 (OCP Microscaling): FP4 E2M1 elements, one E8M0 scale per 32 along K.

The layout gpt-oss ships: element pairs packed in bytes (element 2j in the low nibble),
scale bytes e with X = 2^(e - 127). E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6;
bit 3 is the sign. The quantiser takes X = 2^ceil(log2(amax / 6)), so the block's
largest element fits the grid (no clipping), and rounds to nearest, ties to even code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from edgemoe.quant.formats import ExpertFormat, Parts, PartSpec, cdiv
from edgemoe.quant.int4 import pack_nibbles, unpack_nibbles

BLOCK = 32  # fixed by the OCP MX spec
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E8M0_BIAS = 127
# Midpoints between neighbouring magnitudes, and whether a tie goes up (the upper
# code is the even one) or down.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)


def e2m1_lut(device: torch.device | None = None) -> torch.Tensor:
    """Code 0..15 → value (fp32)."""
    mag = torch.tensor(E2M1_VALUES, device=device)
    return torch.cat([mag, -mag])


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 values with |v| <= 6 → uint8 codes (round to nearest, ties to even code)."""
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for mid, up in zip(_MIDPOINTS, _TIE_UP, strict=True):
        code += (a >= mid if up else a > mid).to(torch.uint8)
    return code | ((v < 0) & (code > 0)).to(torch.uint8) << 3


@dataclass(frozen=True)
class Mxfp4(ExpertFormat):
    name: ClassVar[str] = "mxfp4"

    def matrix_specs(self, rows: int, cols: int) -> dict[str, PartSpec]:
        g = cdiv(cols, BLOCK)
        return {"": ((rows, g * BLOCK // 2), torch.uint8), "_scale": ((rows, g), torch.uint8)}

    def _blocks(self, w: torch.Tensor) -> torch.Tensor:
        n, k = w.shape
        return F.pad(w.float(), (0, cdiv(k, BLOCK) * BLOCK - k)).view(n, -1, BLOCK)

    def exponents(self, w: torch.Tensor) -> torch.Tensor:
        """Per block: ceil(log2(amax / 6)) in [-127, 127] (int32); 0 blocks get -127."""
        amax = self._blocks(w).abs().amax(dim=2)
        # frexp: amax/6 = m * 2^e with m in [0.5, 1): ceil(log2) = e, or e - 1 when m == 0.5 exactly.
        m, e = torch.frexp(amax / E2M1_MAX)
        e = torch.where(m == 0.5, e - 1, e)
        return torch.where(amax > 0, e, torch.full_like(e, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)

    def quantise(self, w: torch.Tensor) -> Parts:
        e = self.exponents(w)
        v = torch.ldexp(self._blocks(w), -e[:, :, None].float())
        codes = e2m1_encode(v.clamp(-E2M1_MAX, E2M1_MAX))
        return {"": pack_nibbles(codes.view(w.shape[0], -1)), "_scale": (e + E8M0_BIAS).to(torch.uint8)}

    def dequantise(self, parts: Parts, rows: int, cols: int, halves: int = 1) -> torch.Tensor:
        data, scale = parts[""], parts["_scale"]
        codes = unpack_nibbles(data, data.shape[1] * 2)[:, :cols].long()
        e = scale.to(torch.int32)[:, torch.arange(cols, device=data.device) // BLOCK] - E8M0_BIAS
        return torch.ldexp(e2m1_lut(data.device)[codes], e.float())

    def error_bound(self, w: torch.Tensor) -> torch.Tensor:
        x = torch.ldexp(torch.ones(()), self.exponents(w).float())[:, torch.arange(w.shape[1]) // BLOCK]
        # E2M1 steps are 0.5 below 2, then 1, then 2: half a step is <= 0.25 * max(|v|, 1) in units of X.
        return 0.25 * torch.maximum(w.float().abs(), x)

    @property
    def label(self) -> str:
        return "mxfp4 (OCP MX, blocks of 32)"
