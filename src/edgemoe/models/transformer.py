"""CausalLM: token embedding → the model file's blocks → final norm → LM head.

Model files build the blocks (one file per `model_type`, from the shared blocks in
`layers/`); this class only runs them over a step and projects the wanted rows. A model
with hyper-connections widens the embedding to `streams` copies and its "norm" is the
final stream mixer; one with per-step inputs of its own (PLE n-grams) adds a step hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.block import PreNormBlock
from edgemoe.layers.context import StepContext
from edgemoe.layers.norm import RMSNorm
from edgemoe.layers.rotary import Rotary


# ids [T] → rows [T, H]: a host-resident embedding (layers/embedding.py)
Embed = Callable[[torch.Tensor], torch.Tensor]


class Block(Protocol):
    """One layer: h [T, H] → h. cos/sin are this step's rotary tables [T, D], or None
    when the attention backend rotates by position itself (`needs_step_rope`)."""

    def __call__(
        self, h: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor: ...


class CausalLM:
    def __init__(
        self,
        arch: object,  # the model file's arch (DecoderArch or its own)
        embed: torch.Tensor | Embed,  # [V, H], or ids [T] → [T, H]
        blocks: Sequence[Block],
        norm: RMSNorm | Callable[[torch.Tensor], torch.Tensor],  # [N, streams·H] → [N, H]
        lm_head: torch.Tensor,  # [V, H]
        rotary: Rotary,
        streams: int = 1,  # hyper-connection streams: the embedding repeated side by side
        step_hook: Callable[[StepContext], StepContext] | None = None,  # per-step inputs of the model's own
        linear: Linear = dense_gemv_ref,  # the LM head's kernel (--dense-kernel)
    ) -> None:
        self.arch, self.embed, self.blocks, self.norm, self.lm_head = arch, embed, list(blocks), norm, lm_head
        self.rotary, self.streams, self.step_hook, self.linear = rotary, streams, step_hook, linear

    @torch.inference_mode()
    def forward(self, ctx: StepContext) -> torch.Tensor:
        """Hidden states after the final norm for `batch.logits_indices` rows: [N, H]."""
        batch = ctx.batch
        if self.step_hook is not None:
            ctx = self.step_hook(ctx)
        h = self.embed[batch.input_ids] if isinstance(self.embed, torch.Tensor) else self.embed(batch.input_ids)
        if self.streams > 1:
            h = h.repeat(1, self.streams)  # [T, streams·H]
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype) if ctx.attention.needs_step_rope else (None, None)
        # A PreNormBlock may hand on the next block's attn_norm of h, fused into its MoE
        # combine (`layers/block.py`). NOTE: `chain_norms` ran over these blocks in this
        # order, so a normed row always comes from the previous block's next_norm, which
        # is this block's attn_norm; any other block drops it.
        normed: torch.Tensor | None = None
        for block in self.blocks:
            if isinstance(block, PreNormBlock):
                h, normed = block.step(h, normed, cos, sin, ctx)
            else:
                h, normed = block(h, cos, sin, ctx), None
        return self.norm(h[batch.logits_indices])

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[N, H] → [N, V] float32 (cast into `out` when given: no second fp32 copy)."""
        raw = self.linear(hidden, self.lm_head)
        return raw.float() if out is None else out.copy_(raw)
