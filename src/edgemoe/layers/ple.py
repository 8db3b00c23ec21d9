"""Per-layer embedding (PLE, Qwen3.8-Flash-Next's `Qwen4ExpTextPLELayer`): hashed n-gram
embeddings injected into every hyper-connection stream of a GDN layer, before its mixer.

    e = the token's n-gram rows, concatenated       [T, P] (from the step's `PleRows`)
    k = groupnorm(e K) per stream, v = e V          [T, hc, H], [T, H]
    q = groupnorm(h) per stream                     [T, hc, H]
    g = <k_s, q_s> / √H;  g = sign(g)·√max(|g|, 1e-6)
    u = sigmoid(g_s) · v                            [T, hc·H]
    h += u + silu(dilated_conv(groupnorm(u)))       (kernel 4, dilation ngram_size)

The conv keeps its last (K-1)·dilation inputs per sequence in the state pool's
`ple_conv` rows (zeros for a fresh sequence), so chunked prefill equals one-shot and a
prefix-cache snapshot carries it. Decode tokens (the step's leading ones) run the
one-token conv form, prompt chunks the varlen form, as the GDN layer does.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from edgemoe.kernels.causal_conv import causal_conv1d_update, causal_conv1d_varlen
from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.norm_fused import grouped_rms_norm
from edgemoe.layers.context import StateStep, StepContext


class PleRows(Protocol):
    """A step's table rows per PLE layer: `rows(j)` [T, P] for the j-th PLE layer."""

    def rows(self, j: int) -> torch.Tensor: ...


class PleLayer:
    def __init__(
        self,
        j: int,  # this layer's index among the PLE layers (its table, its conv state)
        key: torch.Tensor,  # [hc·H, P]
        value: torch.Tensor,  # [H, P]
        norm_key: torch.Tensor,  # [hc·H] zero-centred grouped norms
        norm_query: torch.Tensor,
        norm_conv: torch.Tensor,
        conv: torch.Tensor,  # [hc·H, K] depthwise taps, oldest first
        dilation: int,
        eps: float,
        state_name: str = "ple_conv",  # the state pool extra [N, L_ple, hc·H, (K-1)·dilation]
        linear: Linear = dense_gemv_ref,  # the key / value projections' kernel (--dense-kernel)
    ) -> None:
        self.linear = linear
        self.j, self.key, self.value, self.conv, self.dilation = j, key, value, conv, dilation
        self.norm_key, self.norm_query, self.norm_conv, self.eps = norm_key, norm_query, norm_conv, eps
        self.state_name = state_name
        self.hidden = value.shape[0]
        self.hc = key.shape[0] // self.hidden

    def __call__(self, h: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """h [T, hc·H] → h with this layer's n-gram features added (rows from `ctx.ple`)."""
        T, H, hc = h.shape[0], self.hidden, self.hc
        ple: PleRows = ctx.ple
        e = ple.rows(self.j)  # [T, P]
        key = grouped_rms_norm(self.linear(e, self.key), self.norm_key, self.eps, H).view(T, hc, H)
        value = self.linear(e, self.value)  # [T, H]
        query = grouped_rms_norm(h, self.norm_query, self.eps, H).view(T, hc, H)
        gate = (key * query).sum(dim=-1, keepdim=True) / math.sqrt(H)
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = (torch.sigmoid(gate) * value[:, None, :]).flatten(1)  # [T, hc·H]
        normed = grouped_rms_norm(gated, self.norm_conv, self.eps, H)
        assert ctx.state is not None, "a PLE layer needs the step's state rows (StepContext.state)"
        return h + (gated + self._conv(normed, ctx.state))

    def _conv(self, x: torch.Tensor, st: StateStep) -> torch.Tensor:
        """silu(dilated causal conv) over the step's sequences, conv states from their rows."""
        T = x.shape[0]
        nd = T if st.decode else st.num_decode  # decode sequences come first, one token each
        if nd in (0, T):
            return self._conv_part(x, st, slice(None), st.cu_seqlens, decode=nd == T)
        return torch.cat([
            self._conv_part(x[:nd], st, slice(0, nd), st.cu_seqlens[: nd + 1], decode=True),
            self._conv_part(x[nd:], st, slice(nd, None), st.cu_seqlens[nd:] - nd, decode=False),
        ])

    def _conv_part(self, x: torch.Tensor, st: StateStep, seqs: slice, cu: torch.Tensor, decode: bool) -> torch.Tensor:
        rows, has_state = st.rows[seqs], st.has_initial_state[seqs]
        pool = st.pool.extra(self.state_name)[:, self.j]  # [N, hc·H, S]: a view the kernels update
        if decode:
            return causal_conv1d_update(x, self.conv, None, pool, rows, has_initial_state=has_state,
                                        dilation=self.dilation)
        return causal_conv1d_varlen(x, self.conv, None, pool, rows, cu, has_initial_state=has_state,
                                    dilation=self.dilation)
