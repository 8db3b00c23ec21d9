"""Grouped-query self-attention: fused q/k/v projection, optional q/k RMSNorm and
clipping, rotary, attention through the backend, output projection.

Model files choose the variant: `qk_norm="head"` normalises each head (Qwen3: the
backend applies those norms with rotary, fused into one kernel in the Triton backend),
`"full"` the whole projection (OLMoE), `"none"` nothing (Mixtral). `qkv_bias`: biased
q/k/v projections (GLM-4.5's `attention_bias`; its o_proj has none); `o_bias`: a biased
output projection too (gpt-oss).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention_backend import AttentionBackend, AttentionSpec, HeadNorms
from edgemoe.layers.batch import ForwardBatch
from edgemoe.layers.norm import RMSNorm


class Attention:
    def __init__(
        self,
        spec: AttentionSpec,
        qkv: torch.Tensor,  # [(Hq + 2 Hkv) D, H]
        o_proj: torch.Tensor,  # [H, Hq D]
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        qk_norm: str = "none",
        clip_qkv: float | None = None,
        linear: Linear = dense_gemv_ref,  # the projections' kernel (--dense-kernel)
        qkv_bias: torch.Tensor | None = None,  # [(Hq + 2 Hkv) D]
        o_bias: torch.Tensor | None = None,  # [H]
    ) -> None:
        if qk_norm not in ("none", "head", "full") or (qk_norm != "none") != (q_norm is not None):
            raise ValueError(f"qk_norm {qk_norm!r} needs q/k norms exactly when not 'none'")
        self.spec, self.qkv, self.o_proj = spec, qkv, o_proj
        self.q_norm, self.k_norm, self.qk_norm, self.clip_qkv = q_norm, k_norm, qk_norm, clip_qkv
        self.linear, self.qkv_bias, self.o_bias = linear, qkv_bias, o_bias
        # "head": the backend applies them, fused into its rotary + KV write where it can.
        self.head_norms = HeadNorms(q_norm, k_norm) if qk_norm == "head" else None  # type: ignore[arg-type]
        D = spec.head_dim
        self.split = [spec.num_heads * D, spec.num_kv_heads * D, spec.num_kv_heads * D]

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor | None,  # [T, D] this step's rotary tables (None: the backend rotates by position)
        sin: torch.Tensor | None,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        s, T = self.spec, x.shape[0]
        qkv = self.linear(x, self.qkv, self.qkv_bias)  # a bias added before the one rounding, as F.linear's
        q, k, v = qkv.split(self.split, -1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.reshape(T, s.num_heads, s.head_dim)  # [T, Hq, D]
        k = k.reshape(T, s.num_kv_heads, s.head_dim)  # [T, Hkv, D]
        v = v.reshape(T, s.num_kv_heads, s.head_dim)
        q = backend.rotate_and_write(s, q, k, v, cos, sin, batch, self.head_norms)  # head norms, rotary, KV write
        out = backend.attend(s, q, batch)  # [T, Hq, D]
        return self.linear(out.reshape(T, s.num_heads * s.head_dim), self.o_proj, self.o_bias)
