"""Self-attention with a pluggable backend over the paged KV pool."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels.attention import paged_attention_ref, paged_attention_sdpa, write_kv_ref
from edgemoe.kernels.rotary import apply_rope
from edgemoe.layers.batch import ForwardBatch
from edgemoe.layers.norm import RMSNorm


class AttentionBackend(ABC):
    """Computes attention for one layer of one step.

    Contract: `forward` first stores this step's k/v at `batch.write_slots` of layer
    `layer` in the KV pool, then attends each sequence's queries to its context
    (`SeqSlice.ctx_slots`, which include the tokens just written). The pool pages
    referenced by the batch must stay allocated until the step returns.
    """

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        batch: ForwardBatch,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:  # [T, Hq, D]
        ...


class TorchPagedAttention(AttentionBackend):
    """Gathers each sequence's context through its page table and attends to it.

    `kernel="ref"` is the exact eager reference (it reproduces transformers' eager
    attention bit for bit); "sdpa" uses torch's fused kernels (no score matrix in
    memory); "auto" (the CPU default) takes ref while a sequence's score matrix is
    small and sdpa beyond, so long contexts never materialise gigabytes of scores."""

    REF_MAX_SCORES = 1 << 24  # fp32 scores per sequence (64 MiB) up to which "auto" uses ref

    def __init__(self, pool: KVPool, kernel: str = "ref") -> None:
        self.pool = pool
        self.kernel_name = kernel
        self.kernel = {"ref": paged_attention_ref, "sdpa": paged_attention_sdpa, "auto": None}[kernel]

    def forward(self, layer, q, k, v, batch, scale, window):  # type: ignore[override]
        k_cache, v_cache = self.pool.k[layer], self.pool.v[layer]
        write_kv_ref(k_cache, v_cache, k, v, batch.write_slots)
        out = torch.empty_like(q)
        for s in batch.seqs:
            kernel = self.kernel or (
                paged_attention_ref if q.shape[1] * s.q_len * s.ctx_len <= self.REF_MAX_SCORES else paged_attention_sdpa
            )
            out[s.q_start : s.q_start + s.q_len] = kernel(
                q, k_cache, v_cache, s.q_start, s.q_len, s.ctx_slots, scale, window
            )
        return out


class Attention:
    """q/k/v projection (fused), optional q/k RMSNorm, RoPE, attention, output projection.

    `qk_norm`: "head" normalises each head (Qwen3), "full" the whole projection (OLMoE).
    """

    def __init__(
        self,
        layer: int,
        qkv: torch.Tensor,  # [(Hq + 2 Hkv) D, H]
        o_proj: torch.Tensor,  # [H, Hq D]
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_norm: RMSNorm | None,
        k_norm: RMSNorm | None,
        qk_norm: str,
        clip_qkv: float | None,
        window: int | None,
    ) -> None:
        self.layer = layer
        self.qkv, self.o_proj = qkv, o_proj
        self.hq, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.q_norm, self.k_norm, self.qk_norm = q_norm, k_norm, qk_norm
        self.clip_qkv = clip_qkv
        self.window = window
        self.scale = head_dim**-0.5

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = F.linear(x, self.qkv).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], -1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.reshape(T, self.hq, self.d)  # [T, Hq, D]
        k = k.reshape(T, self.hkv, self.d)  # [T, Hkv, D]
        v = v.reshape(T, self.hkv, self.d)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = backend.forward(self.layer, q, k, v, batch, self.scale, self.window)
        return F.linear(out.reshape(T, self.hq * self.d), self.o_proj)
