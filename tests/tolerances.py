"""Numeric tolerances from a dtype's rounding and the magnitude compared.

Never "just above what this CPU produced": CI and users run other CPUs, whose BLAS
blocks and vectorises reductions differently. Every bound here is a worst case of the
rounding the computation can do (u = eps / 2 per operation, Higham, *Accuracy and
Stability of Numerical Algorithms*, §2-3), so it holds for any summation order.
(Importable because tests/conftest.py puts this folder on sys.path.)
"""

from __future__ import annotations

import torch


def eps(dtype: torch.dtype) -> float:
    """Distance from 1.0 to the next representable number; unit roundoff is eps / 2."""
    return torch.finfo(dtype).eps


def rounding_atol(dtype: torch.dtype, ops: int, magnitude: float) -> float:
    """Two results that went through at most `ops` roundings each (elementwise ops,
    casts) on values of size <= `magnitude`: each is within ops·u·magnitude of exact."""
    return 2 * ops * (eps(dtype) / 2) * magnitude


def sum_atol(dtype: torch.dtype, terms: int, magnitude: float) -> float:
    """Two evaluations of one sum (dot product) of `terms` terms, in any order or
    blocking, whose terms' absolute values add up to <= `magnitude`: each is within
    γ_n·magnitude of the exact sum, γ_n = n·u / (1 - n·u) (Higham Thm 3.1 / eq. 3.5)."""
    u = eps(dtype) / 2
    gamma = terms * u / (1 - terms * u)
    return 2 * gamma * magnitude


def log_softmax_atol(dtype: torch.dtype, vocab: int, magnitude: float) -> float:
    """log_softmax of one row of `vocab` logits, computed twice, `magnitude` = the largest
    |logprob|: x - max is one rounding; the log-sum-exp sums `vocab` terms in (0, 1], each
    exp within an ulp, so its sum is within (vocab + 1)·u relative and its log within
    that absolute; the final subtraction rounds once more."""
    u = eps(dtype) / 2
    one = (vocab + 1) * u + 3 * u * magnitude
    return 2 * one


def network_atol(dtype: torch.dtype, longest_reduction: int, magnitude: float) -> float:
    """Outputs of one network (logits) computed by two implementations that order their
    reductions differently, `magnitude` = the largest |output|: a worst-case reduction
    error eps·n·|output| with n the longest reduction of the forward pass (hidden size,
    expert width, or the attention context). NOTE: the tiny test models chain 2-4 layers,
    each re-normalised to unit scale by RMSNorm; their independent rounding errors add
    like a random walk, far below the worst case of even one reduction of that length."""
    return sum_atol(dtype, longest_reduction, magnitude)


def attention_atol(dtype: torch.dtype, head_dim: int, ctx_len: int, v_max: float, score_terms_max: float) -> float:
    """softmax(q·k·scale) @ v computed two ways. A score is a sum of `head_dim` terms whose
    absolute values add up to <= `score_terms_max` (γ_D of that); a score error δ moves a
    weight by <= 2δ relative (its exp and the normaliser); the normaliser sums `ctx_len`
    exps (each within an ulp) and the output sums `ctx_len` weighted values of size
    <= `v_max` with weights adding up to 1."""
    u = eps(dtype) / 2

    def gamma(n: int) -> float:
        return n * u / (1 - n * u)

    one = v_max * (gamma(ctx_len) + gamma(ctx_len + 2) + 2 * gamma(head_dim) * score_terms_max)
    return 2 * one


# Roundings to bf16 a residual-stream value goes through per decoder layer on the bf16
# path: attn norm (2), q/k/v (1), q/k norm (2), RoPE (cos/sin 1, 2 products, a sum),
# attention (2: its output and the o_proj), residual add (1), MoE norm (2), router (1),
# gate/up (1), SiLU (1), × up (1), down (1), × routing weight (1), top-k sum (k <= 8:
# 7), residual add (1); rounded up to 32.
BF16_ROUNDINGS_PER_LAYER = 32


def bf16_logit_error(num_layers: int) -> tuple[float, float]:
    """(typical, worst) error of bf16 logits relative to the logit scale, against exact
    arithmetic, after `num_layers` layers of R = BF16_ROUNDINGS_PER_LAYER roundings each,
    each off by <= u relative (RMSNorm keeps the stream at unit scale): worst R·u when
    every rounding errs the same way; typical sqrt(R)·eps, 3.5 standard deviations of the
    random walk of R errors uniform in [-u, u] (so a mean |error| stays well below it)."""
    r = BF16_ROUNDINGS_PER_LAYER * num_layers
    return r**0.5 * eps(torch.bfloat16), r * eps(torch.bfloat16) / 2


def peer_atol(dtype: torch.dtype, peer_error: float, longest_reduction: int, magnitude: float) -> float:
    """Outputs in `dtype` against a float64 evaluation of the same network, when the network
    can amplify rounding far beyond a sum's worst case: a GDN layer's chunked rule solves a
    64x64 unit-triangular system per chunk, whose error is its condition number times γ_n
    (Higham Thm 8.5), and that number (up to 2^63 for such systems) depends on the inputs,
    so no a-priori bound is useful. The reference implementation's own error in `dtype` on
    the same inputs (`peer_error`, its largest over all outputs) measures that conditioning;
    another summation order of the same operations errs by the same bound, realised
    differently: 4× the peer's realised error leaves room for that (2× for each of the two
    orders' rounding landing anywhere within the bound), never less than `network_atol`."""
    return max(4 * peer_error, network_atol(dtype, longest_reduction, magnitude))
