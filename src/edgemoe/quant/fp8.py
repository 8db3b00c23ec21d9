"""FP8 e4m3 weights with one fp32 scale per 128 x 128 block (Qwen3 / DeepSeek `*-FP8`).

W ≈ q * scale_inv[r // B, k // B]: `weight_scale_inv` is the multiplier (DeepSeek's
name; it is the inverse of the scale that divided W). A block's scale is its largest
|w| / 448 (e4m3's largest finite value), so its largest element lands on 448.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from edgemoe.quant.formats import ExpertFormat, Parts, PartSpec, cdiv

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 relative; below 2^-6
# (subnormal) the spacing is 2^-9, so the rounding is within 2^-10 absolute.
E4M3_REL = 2.0**-4
E4M3_SUB_ABS = 2.0**-10


def block_index(rows: int, block: int, halves: int, device: torch.device | None = None) -> torch.Tensor:
    """Row → row block when `halves` matrices of rows/halves rows each were blocked
    separately and concatenated (gate_up: gate's blocks, then up's)."""
    n = rows // halves
    r = torch.arange(rows, device=device)
    return (r // n) * cdiv(n, block) + (r % n) // block


@dataclass(frozen=True)
class Fp8Block(ExpertFormat):
    block: int = 128
    name: ClassVar[str] = "fp8"

    def matrix_specs(self, rows: int, cols: int) -> dict[str, PartSpec]:
        return {"": ((rows, cols), E4M3), "_scale": ((cdiv(rows, self.block), cdiv(cols, self.block)), torch.float32)}

    def quantise(self, w: torch.Tensor) -> Parts:
        n, k = w.shape
        b = self.block
        nb, kb = cdiv(n, b), cdiv(k, b)
        blocks = F.pad(w.float(), (0, kb * b - k, 0, nb * b - n)).view(nb, b, kb, b)
        amax = blocks.abs().amax(dim=(1, 3))
        scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        # NOTE: clamp before the cast: w / scale may round just past 448, and e4m3fn has no infinity.
        q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        return {"": q.view(nb * b, kb * b)[:n, :k].contiguous(), "_scale": scale}

    def dequantise(self, parts: Parts, rows: int, cols: int, halves: int = 1) -> torch.Tensor:
        q, scale = parts[""], parts["_scale"]
        rb = block_index(rows, self.block, halves, q.device)
        cb = torch.arange(cols, device=q.device) // self.block
        return q.float() * scale.float()[rb][:, cb]

    def error_bound(self, w: torch.Tensor) -> torch.Tensor:
        scale = self.dequantise({"": torch.ones_like(w, dtype=E4M3), "_scale": self.quantise(w)["_scale"]}, *w.shape)
        # The division w / scale adds an fp32 rounding (2^-24 relative): covered by the slack.
        return E4M3_REL * w.float().abs() * (1 + 2.0**-20) + E4M3_SUB_ABS * scale

    @property
    def label(self) -> str:
        return f"fp8 e4m3 ({self.block}x{self.block} blocks)"
