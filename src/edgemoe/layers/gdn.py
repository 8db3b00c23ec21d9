"""Gated DeltaNet (the linear-attention layers of Qwen3-Next / Qwen3.5) over a varlen batch.

    q|k|v = silu(causal_conv4(x W_qkv)),   z = x W_z,   b = x W_b,   a = x W_a
    beta = sigmoid(b),   g = -exp(A_log) · softplus(a + dt_bias)
    o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)      (state: one pool row per sequence)
    y = (rmsnorm(o) · w · silu(z)) W_out                          (per value head)

One GEMM computes every projection (`in_proj` rows: q | k | v | z | b | a; the model file
lays them out so, whatever the checkpoint's layout). Each sequence's conv and recurrent
states live in the step's `StateStep` rows; the kernels read them first and write them
back (`kernels/gdn.py`). Decode tokens (one per sequence, the batch's leading ones) run
the one-token forms (sync-free, graph-capturable) whatever else is in the step, so their
results do not depend on the step's company; prompt chunks run the varlen prefill forms,
which start a sequence from zeros where its chunk starts at position 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.kernels.causal_conv import causal_conv1d_update, causal_conv1d_varlen
from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.gated_norm import gated_rms_norm
from edgemoe.kernels.gdn import gdn_gates
from edgemoe.kernels.gdn_backends import GdnKernels
from edgemoe.layers.context import StateStep, StepContext


@dataclass(frozen=True)
class GdnSpec:
    """One GDN layer's constants."""

    layer: int  # index into the state pool's layers (GDN layers only)
    num_k_heads: int  # Hk (q and k heads)
    num_v_heads: int  # Hv, a multiple of Hk
    key_dim: int  # Dk
    value_dim: int  # Dv
    eps: float  # the gated norm's
    gate: str = "silu"  # the gated norm's activation of z: silu, or sigmoid (Qwen3.8-Flash-Next's option)

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.key_dim + self.num_v_heads * self.value_dim

    @property
    def proj_split(self) -> list[int]:
        """Widths of q|k|v (the conv's input), z, b, a in `in_proj`'s output."""
        return [self.conv_channels, self.num_v_heads * self.value_dim, self.num_v_heads, self.num_v_heads]


class GatedDeltaNet:
    def __init__(
        self,
        spec: GdnSpec,
        in_proj: torch.Tensor,  # [C + Hv Dv + 2 Hv, H]: q | k | v | z | b | a rows
        conv: torch.Tensor,  # [C, K] depthwise taps, oldest first
        A_log: torch.Tensor,  # [Hv]
        dt_bias: torch.Tensor,  # [Hv]
        norm: torch.Tensor,  # [Dv] the gated norm's weight (plain w, not 1 + w)
        out_proj: torch.Tensor,  # [H, Hv Dv]
        kernels: GdnKernels,
        linear: Linear = dense_gemv_ref,  # the projections' kernel (--dense-kernel)
    ) -> None:
        self.spec, self.in_proj, self.conv, self.out_proj, self.kernels = spec, in_proj, conv, out_proj, kernels
        self.A_log, self.dt_bias, self.norm = A_log, dt_bias, norm
        self.linear = linear

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        """x [T, H] → [T, H]; cos/sin unused (no positions in a recurrence)."""
        s, st, T = self.spec, ctx.state, x.shape[0]
        assert st is not None, "a GDN layer needs the step's state rows (StepContext.state)"
        qkv, z, b, a = self.linear(x, self.in_proj).split(s.proj_split, -1)
        nd = T if st.decode else st.num_decode  # decode sequences come first, one token each
        if nd in (0, T):
            o = self._mix(st, qkv, b, a, slice(None), st.cu_seqlens, decode=nd == T)
        else:
            cu = st.cu_seqlens[nd:] - nd  # the prompt chunks' own offsets (a device op, no sync)
            o = torch.cat([
                self._mix(st, qkv[:nd], b[:nd], a[:nd], slice(0, nd), st.cu_seqlens[: nd + 1], decode=True),
                self._mix(st, qkv[nd:], b[nd:], a[nd:], slice(nd, None), cu, decode=False),
            ])
        o = gated_rms_norm(o, z.view(T, s.num_v_heads, s.value_dim), self.norm, s.eps, s.gate)
        return self.linear(o.reshape(T, -1), self.out_proj)

    def _mix(
        self, st: StateStep, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, seqs: slice,
        cu_seqlens: torch.Tensor, decode: bool,
    ) -> torch.Tensor:
        """Conv, gates and rule for the sequences `seqs` of the step (their tokens' qkv/b/a
        [n, ...]) → o [n, Hv, Dv]."""
        s, n = self.spec, qkv.shape[0]
        conv_pool, state_pool = st.pool.layer(s.layer)
        rows, has_state = st.rows[seqs], st.has_initial_state[seqs]
        if decode:
            qkv = causal_conv1d_update(qkv, self.conv, None, conv_pool, rows, has_initial_state=has_state)
        else:
            qkv = causal_conv1d_varlen(qkv, self.conv, None, conv_pool, rows, cu_seqlens, has_initial_state=has_state)
        key_width = s.num_k_heads * s.key_dim
        q, k, v = qkv.split([key_width, key_width, s.num_v_heads * s.value_dim], -1)
        g, beta = gdn_gates(a, b, self.A_log, self.dt_bias)
        rule = self.kernels.decode if decode else self.kernels.prefill
        return rule(
            q.view(n, s.num_k_heads, s.key_dim), k.view(n, s.num_k_heads, s.key_dim),
            v.view(n, s.num_v_heads, s.value_dim), g, beta, cu_seqlens, state_pool, rows,
            has_initial_state=has_state, use_qk_l2norm=True,
        )
