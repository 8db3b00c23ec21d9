"""Hyper-connections (Qwen3.8-Flash-Next's `Qwen4ExpTextGatedResidual`): the residual stream
is `hc` streams side by side, h [T, hc·H]. Before a sub-layer (mixer or MLP):

    n = groupnorm(h)                               (zero-centred RMSNorm per stream)
    w = sigmoid(up(silu(down(n) / hc)))            [T, hc·H]: a low-rank input mix
    x = mean_s(w_s · n_s)                          [T, H]: the sub-layer's input
    g = 2 · sigmoid(inject(n) / hc)                [T, hc]

and after it h += y ⊗ g (the output y [T, H] added to stream s scaled by g_s). The final
mixer (no inject weights) turns the streams into the LM head's input. `down` and `inject`
read the same n: one GEMM over their stacked weights (`down` rows first). The ops and their
dtypes are transformers', in order; on a GPU the elementwise steps between the two GEMVs
are four launches (`kernels/hyper_connection.py`), and an injection may be handed to the
next mix (`mix(h, inject=...)`), which adds it in its norm's launch.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.hyper_connection import Inject, hc_gates, hc_inject, hc_mix, hc_norm


class HyperConnection:
    def __init__(
        self,
        norm: torch.Tensor,  # [hc·H] the zero-centred grouped norm's weight
        down: torch.Tensor,  # [R (+ hc), hc·H]: the low-rank down projection, then the inject rows if any
        up: torch.Tensor,  # [hc·H, R]
        hc: int,
        eps: float,
        linear: Linear = dense_gemv_ref,  # the projections' kernel (--dense-kernel)
    ) -> None:
        self.norm, self.down, self.up, self.hc, self.eps = norm, down, up, hc, eps
        self.linear = linear
        self.hidden = norm.shape[0] // hc
        self.rank = up.shape[1]
        self.injects = down.shape[0] > self.rank

    def mix(
        self, h: torch.Tensor, inject: Inject | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """h [T, hc·H] → (the sub-layer's input [T, H], the inject weights [T, hc] or None,
        the streams). `inject` (y, g): the previous sub-layer's output and weights, added to
        h first (`inject(h, y, g)`); the streams returned are then the sum."""
        n, h = hc_norm(h, self.norm, self.eps, self.hidden, inject)
        a, g = hc_gates(self.linear(n, self.down), self.rank, self.hc)  # z [T, R (+ hc)] → silu(z/hc), 2σ(z/hc)
        x = hc_mix(self.linear(a, self.up), n, self.hc)  # mean_s(σ(w_s) · n_s)
        return x, g, h

    @staticmethod
    def inject(h: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """h [T, hc·H] + y [T, H] scaled per stream by g [T, hc]."""
        return hc_inject(h, y, g)
