"""Gated attention (the full-attention layers of Qwen3-Next / Qwen3.5).

Like Qwen3's attention (per-head q/k RMSNorm, then rotary, GQA over the paged KV cache)
with three differences: `q_proj` yields each head's query *and* an output gate
(per head: D query dims then D gate dims), the attention output is multiplied by
sigmoid(gate) before `o_proj`, and the q/k norms are zero-centred (x·(1 + w)). Rotary
is usually partial (the first 25% of each head rotates; the cos/sin tables are that wide).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention_backend import AttentionSpec
from edgemoe.layers.context import StepContext
from edgemoe.layers.norm import OffsetRMSNorm


class GatedAttention:
    def __init__(
        self,
        spec: AttentionSpec,  # spec.layer: this layer's index in the KV pool (attention layers only)
        qkv: torch.Tensor,  # [(2 Hq + 2 Hkv) D, H]: q_proj (query|gate per head), k_proj, v_proj rows
        o_proj: torch.Tensor,  # [H, Hq D]
        q_norm: OffsetRMSNorm,
        k_norm: OffsetRMSNorm,
        linear: Linear = dense_gemv_ref,  # the projections' kernel (--dense-kernel)
    ) -> None:
        self.spec, self.qkv, self.o_proj, self.q_norm, self.k_norm = spec, qkv, o_proj, q_norm, k_norm
        self.linear = linear
        D = spec.head_dim
        self.split = [2 * spec.num_heads * D, spec.num_kv_heads * D, spec.num_kv_heads * D]

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        """x [T, H]; cos/sin [T, R] (R ≤ D: partial rotary; None: the backend rotates by
        position from `spec.rope`) → [T, H]."""
        q, gate = self.project_and_write(x, cos, sin, ctx)
        return self.output(ctx.attention.attend(self.spec, q, ctx.batch), gate)

    def project_and_write(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rotated queries [T, Hq, D], output gates [T, Hq, D]); the step's K/V written."""
        s, T = self.spec, x.shape[0]
        q_gate, k, v = self.linear(x, self.qkv).split(self.split, -1)
        q_gate = q_gate.view(T, s.num_heads, 2 * s.head_dim)
        q, gate = q_gate[..., : s.head_dim], q_gate[..., s.head_dim :]  # [T, Hq, D] each
        q = self.q_norm(q)
        k = self.k_norm(k.reshape(T, s.num_kv_heads, s.head_dim))  # [T, Hkv, D]
        v = v.reshape(T, s.num_kv_heads, s.head_dim)
        return ctx.attention.rotate_and_write(s, q, k, v, cos, sin, ctx.batch), gate

    def output(self, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Attention output [T, Hq, D] → gated, projected [T, H]."""
        T, s = out.shape[0], self.spec
        out = out.reshape(T, s.num_heads * s.head_dim) * torch.sigmoid(gate.reshape(T, -1))
        return self.linear(out, self.o_proj)
