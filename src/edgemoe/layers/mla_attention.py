"""Multi-head latent attention (MLA: DeepSeek-V2/V3, GLM-4.7-Flash), absorbed into the
latent space so the KV cache holds one 576-wide row a token and layer, not 2 × heads.

Per token the checkpoint's projections give a query per head (through a low-rank
`q_a` → RMSNorm → `q_b`, or one `q` projection) split into a no-position part of
`nope` dims and a rotary part of `rope` dims, and one shared key/value latent: `kv_a`
→ the latent `c` (`kv_lora` dims, RMSNorm'd) and one rotary key `k_pe` (`rope` dims).
`kv_b` expands `c` into each head's no-position key (W_UK, `nope` rows a head) and value
(W_UV, `v` rows a head). transformers expands the cache to keys and values; here the
expansion is folded into the query and the output instead (the same sums, associated
the other way):

    score_h(t, s) = q_nope_h(t) · (W_UK_h c(s)) + q_pe_h(t) · k_pe(s)
                  = (W_UK_hᵀ q_nope_h(t)) · c(s) + q_pe_h(t) · k_pe(s)
    out_h(t)      = W_UV_h Σ_s p_h(t, s) c(s)

so attention is multi-query over one head of D = rope + kv_lora dims: query
[q_pe_h | W_UK_hᵀ q_nope_h], key [k_pe | c], and the value is the key itself (its first
`rope` output dims are dropped). The KV pool stores that one row (`KVPool(shared_kv=True)`:
V is K's tensor), which any attention backend reads as it reads GQA's K and V.

Rotary: the rotary dims lead the query and the key, so the backend rotates them as any
partial rotary (`spec.head_dim` dims, the first `rope` turning) and writes the key once
(`rotate_and_write`'s `v` None: the value is the key; the Triton backend in one launch,
`rope_write_kv`). DeepSeek's interleaved rotary pairs (dims
2i, 2i + 1) are the rotate-half pairs (i, i + rope/2) of rows permuted at build
(`deinterleave_rope`): scores are dot products, unchanged by one permutation of q and k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.layers.attention_backend import AttentionBackend, AttentionSpec
from edgemoe.layers.batch import ForwardBatch
from edgemoe.layers.norm import RMSNorm


@dataclass(frozen=True)
class MlaDims:
    num_heads: int
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim
    kv_lora: int  # kv_lora_rank: the latent's width
    v: int  # v_head_dim

    @property
    def cache_dim(self) -> int:
        """The one cached row a token: [k_pe | c]."""
        return self.rope + self.kv_lora


@dataclass
class MlaWeights:
    """One layer's projections as `F.linear` takes them ([out, in]); W_UK / W_UV split per head.
    The two projections of the layer's input are one (`first`: the query's first, q_a or
    the one q projection, then kv_a): x is read once, one launch."""

    first: torch.Tensor  # [q_rows + kv_lora + rope, hidden]
    q_rows: int  # the query's rows of `first`: q_lora, or Hq (nope + rope) without q_a
    kv_a_norm: RMSNorm
    w_uk: torch.Tensor  # [Hq, nope, kv_lora]
    w_uv_t: torch.Tensor  # [Hq, kv_lora, v]
    o_proj: torch.Tensor  # [hidden, Hq v]
    q_b: torch.Tensor | None = None  # [Hq (nope + rope), q_lora] (None: one q projection)
    q_a_norm: RMSNorm | None = None
    first_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None


def split_kv_b(kv_b: torch.Tensor, d: MlaDims) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b [Hq (nope + v), kv_lora] → (W_UK [Hq, nope, kv_lora], W_UVᵀ [Hq, kv_lora, v]), contiguous."""
    per_head = kv_b.view(d.num_heads, d.nope + d.v, d.kv_lora)
    return per_head[:, : d.nope].contiguous(), per_head[:, d.nope :].transpose(1, 2).contiguous()


def deinterleave_rope(w: torch.Tensor, groups: int, start: int) -> torch.Tensor:
    """`w` [groups · width, ...] with each group's rows from `start` on (a rotary part: pairs
    2i, 2i + 1) reordered evens first, then odds: DeepSeek's interleaved rotary becomes the
    rotate-half layout (a new tensor)."""
    g = w.reshape(groups, -1, *w.shape[1:])
    rot = g[:, start:]
    return torch.cat((g[:, :start], rot[:, 0::2], rot[:, 1::2]), 1).reshape(w.shape)


class MlaAttention:
    def __init__(self, spec: AttentionSpec, dims: MlaDims, w: MlaWeights, linear: Linear = dense_gemv_ref) -> None:
        if spec.num_kv_heads != 1 or spec.head_dim != dims.cache_dim:
            raise ValueError(f"MLA attends over one head of {dims.cache_dim} dims, got {spec.num_kv_heads} x "
                             f"{spec.head_dim}")
        self.spec, self.dims, self.w, self.linear = spec, dims, w, linear

    def __call__(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor | None,  # [T, rope] this step's rotary tables (None: the backend rotates by position)
        sin: torch.Tensor | None,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        d, w, T = self.dims, self.w, x.shape[0]
        first = self.linear(x, w.first, w.first_bias)
        q, kv = first[:, : w.q_rows], first[:, w.q_rows :]  # kv: [T, kv_lora + rope]
        if w.q_b is not None:
            assert w.q_a_norm is not None
            q = self.linear(w.q_a_norm(q), w.q_b)
        q = q.view(T, d.num_heads, d.nope + d.rope)
        latent = w.kv_a_norm(kv[:, : d.kv_lora])
        q_latent = torch.bmm(q[..., : d.nope].transpose(0, 1), w.w_uk).transpose(0, 1)  # [T, Hq, kv_lora]
        query = torch.cat((q[..., d.nope :], q_latent), -1)  # [T, Hq, rope + kv_lora]: rotary dims first
        key = torch.cat((kv[:, None, d.kv_lora :], latent[:, None, :]), -1)  # [T, 1, rope + kv_lora]
        # The backend rotates the first `rope` dims of each and writes the key once: V is K.
        query = backend.rotate_and_write(self.spec, query, key, None, cos, sin, batch)
        out = backend.attend(self.spec, query, batch)  # [T, Hq, rope + kv_lora]
        heads = torch.bmm(out[..., d.rope :].transpose(0, 1), w.w_uv_t)  # [Hq, T, v]
        return self.linear(heads.transpose(0, 1).reshape(T, d.num_heads * d.v), w.o_proj, w.o_bias)
