"""INT8 weights with one fp32 scale per output row (per-channel, symmetric).

W ≈ q * scale[r], q in [-127, 127], scale = the row's largest |w| / 127.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from edgemoe.quant.formats import ExpertFormat, Parts, PartSpec

INT8_MAX = 127


@dataclass(frozen=True)
class Int8Channel(ExpertFormat):
    name: ClassVar[str] = "int8"

    def matrix_specs(self, rows: int, cols: int) -> dict[str, PartSpec]:
        return {"": ((rows, cols), torch.int8), "_scale": ((rows, 1), torch.float32)}

    def quantise(self, w: torch.Tensor) -> Parts:
        wf = w.float()
        amax = wf.abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        q = torch.round(wf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return {"": q, "_scale": scale}

    def dequantise(self, parts: Parts, rows: int, cols: int, halves: int = 1) -> torch.Tensor:
        return parts[""].float() * parts["_scale"].float()

    def error_bound(self, w: torch.Tensor) -> torch.Tensor:
        scale = self.quantise(w)["_scale"]
        # Half a step, plus the fp32 rounding of w / scale (2^-24 of up to 127 steps).
        return (0.5 + 127 * 2.0**-23) * scale.expand_as(w)

    @property
    def label(self) -> str:
        return "int8 (per-channel)"
