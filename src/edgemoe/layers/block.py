"""The pre-norm decoder block the Llama-style MoE families share:

    h = h + attn(norm(h));  h = h + mlp(norm(h))

Model files build one per layer from their own attention and MLP choices.

Chained blocks (`chain_norms`) hand the next block's input norm forward: a block's MoE
combine (residual add included) also writes the next block's `attn_norm` of its output,
one kernel instead of two (`moe_experts.moe_combine_norm`), and the next block skips its
own. The model's layer loop (`models/transformer.py`) carries the normed row along.

A MoE block's residual add after the attention and its `mlp_norm` run inside the router's
launch (`SparseMoE.add_norm_route`, on a GPU for decode batches): one kernel fewer a layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch

from edgemoe.env_switch import env_switch
from edgemoe.layers.attention import Attention
from edgemoe.layers.context import StepContext
from edgemoe.layers.mlp import DenseMLP
from edgemoe.layers.moe import SparseMoE, router_norm_enabled
from edgemoe.layers.norm import RMSNorm
from edgemoe.layers.shared_moe import SharedExpertMoE


class PreNormBlock:
    def __init__(self, attn: Attention, attn_norm: RMSNorm, mlp: SparseMoE | SharedExpertMoE | DenseMLP,
                 mlp_norm: RMSNorm) -> None:
        self.attn, self.attn_norm, self.mlp, self.mlp_norm = attn, attn_norm, mlp, mlp_norm
        # The next block's attn_norm, computed with this block's MoE combine (`chain_norms`);
        # None: the next block norms its input itself.
        self.next_norm: RMSNorm | None = None
        # The residual add + mlp_norm inside the MoE router's launch (`SparseMoE.add_norm_route`),
        # unless EDGEMOE_ROUTER_NORM=0 (A/B runs; the results are bitwise the same either way).
        self.route_norm = isinstance(mlp, SparseMoE) and router_norm_enabled()

    def __call__(
        self, h: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        """One layer on its own: h → h (its own input norm, none computed ahead)."""
        x, h, routing = self._attention(h, None, cos, sin, ctx)
        return self._mlp(x, h, routing, None, ctx)[0]

    def step(
        self, h: torch.Tensor, normed: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
        ctx: StepContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer in a chain: (h, next_norm(h)). `normed`: this block's attn_norm(h) when
        the previous block computed it (NOTE: the caller hands it only to the block whose
        attn_norm made it). The second result is None when there is no next norm or the
        MLP cannot fuse it (a dense layer): the next block then norms h itself."""
        x, h, routing = self._attention(h, normed, cos, sin, ctx)
        return self._mlp(x, h, routing, self.next_norm, ctx)

    def _mlp(
        self, x: torch.Tensor, h: torch.Tensor, routing: tuple[torch.Tensor, torch.Tensor] | None,
        next_norm: RMSNorm | None, ctx: StepContext,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h + mlp(x), next_norm of it when a MoE combine can fuse it, else None)."""
        with ctx.profiler.region("mlp" if isinstance(self.mlp, DenseMLP) else "moe"):
            host = ctx.batch.host
            if not isinstance(self.mlp, SparseMoE):
                return self.mlp(x, residual=h, num_decode=host.num_decode, num_padding=host.num_padding), None
            if next_norm is not None:
                return self.mlp.call_normed(x, h, next_norm, host.num_decode, host.num_padding, routing)
            return self.mlp(x, h, host.num_decode, host.num_padding, routing), None

    def _attention(
        self, h: torch.Tensor, normed: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
        ctx: StepContext,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(mlp_norm(h'), h', routing) with h' = h + attn(attn_norm(h)): the add and norm in
        one kernel (routing None), or in the MoE router's launch (`route_norm`) with the
        router's (ids, weights) of mlp_norm(h')."""
        with ctx.profiler.region("attention"):
            a = self.attn(self.attn_norm(h) if normed is None else normed, cos, sin, ctx.batch, ctx.attention)
            if not self.route_norm:
                x, h = self.mlp_norm.add_and_norm(a, h)  # h += attn; x = norm(h), one kernel
                return x, h, None
        assert isinstance(self.mlp, SparseMoE)
        with ctx.profiler.region("moe"):  # the router's launch
            x, h, ids, weights = self.mlp.add_norm_route(a, h, self.mlp_norm)
        return x, h, (ids, weights)


def chain_norms(blocks: Sequence[PreNormBlock]) -> None:
    """Hand each block the next one's input norm to fuse into its MoE combine, unless
    `EDGEMOE_COMBINE_NORM=0` (A/B runs; the results are bitwise the same either way).
    The last block keeps its own output unnormed: the final norm sees only the rows
    whose logits are wanted."""
    if not env_switch("EDGEMOE_COMBINE_NORM", True):
        return
    for block, nxt in pairwise(blocks):
        block.next_norm = nxt.attn_norm
