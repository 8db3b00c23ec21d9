"""The pre-norm decoder block the Llama-style MoE families share:

    h = h + attn(norm(h));  h = h + mlp(norm(h))

Model files build one per layer from their own attention and MLP choices.
"""

from __future__ import annotations

import torch

from edgemoe.layers.attention import Attention
from edgemoe.layers.context import StepContext
from edgemoe.layers.mlp import DenseMLP
from edgemoe.layers.moe import SparseMoE
from edgemoe.layers.norm import RMSNorm


class PreNormBlock:
    def __init__(self, attn: Attention, attn_norm: RMSNorm, mlp: SparseMoE | DenseMLP, mlp_norm: RMSNorm) -> None:
        self.attn, self.attn_norm, self.mlp, self.mlp_norm = attn, attn_norm, mlp, mlp_norm

    def __call__(
        self, h: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        with ctx.profiler.region("attention"):
            a = self.attn(self.attn_norm(h), cos, sin, ctx.batch, ctx.attention)
            x, h = self.mlp_norm.add_and_norm(a, h)  # h += attn; x = norm(h), one kernel
        with ctx.profiler.region("moe" if isinstance(self.mlp, SparseMoE) else "mlp"):
            host = ctx.batch.host
            return self.mlp(x, residual=h, num_decode=host.num_decode, num_padding=host.num_padding)
