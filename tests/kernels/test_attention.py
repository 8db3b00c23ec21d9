"""Paged attention kernels against a dense causal reference built independently."""

from __future__ import annotations

import pytest
import torch
from tolerances import attention_atol

from edgemoe.kernels.attention import paged_attention_ref, paged_attention_sdpa


def dense_reference(q, k, v, ctx_len, window):  # noqa: ANN001, ANN201
    """q [q, Hq, D] at positions ctx_len-q..ctx_len-1; k/v [C, Hkv, D]; plain loops over heads."""
    q_len, hq, d = q.shape
    groups = hq // k.shape[1]
    out = torch.empty_like(q)
    for h in range(hq):
        kh, vh = k[:, h // groups], v[:, h // groups]
        for i in range(q_len):
            pos = ctx_len - q_len + i
            lo = 0 if window is None else max(0, pos - window + 1)
            s = (kh[lo : pos + 1] @ q[i, h]) * d**-0.5
            out[i, h] = torch.softmax(s, 0) @ vh[lo : pos + 1]
    return out


@pytest.mark.parametrize("kernel", [paged_attention_ref, paged_attention_sdpa])
@pytest.mark.parametrize("q_len,ctx_len,window", [(1, 9, None), (5, 5, None), (3, 11, None), (4, 12, 5), (1, 12, 3)])
def test_paged_attention(kernel, q_len: int, ctx_len: int, window) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(q_len * 100 + ctx_len)
    hq, hkv, d, slots = 4, 2, 8, 40
    k_cache, v_cache = torch.randn(slots, hkv, d, generator=g), torch.randn(slots, hkv, d, generator=g)
    ctx_slots = torch.randperm(slots, generator=g)[:ctx_len]  # scattered pages
    q = torch.randn(q_len + 2, hq, d, generator=g)  # two rows of another sequence first
    got = kernel(q, k_cache, v_cache, 2, q_len, ctx_slots, d**-0.5, window)
    k, v = k_cache[ctx_slots], v_cache[ctx_slots]
    want = dense_reference(q[2:], k, v, ctx_len, window)
    score_terms = (q[2:].abs().flatten(0, 1) @ k.abs().flatten(0, 1).T).max().item() * d**-0.5  # max Σ|q_i k_i|·scale
    atol = attention_atol(torch.float32, d, ctx_len, v.abs().max().item(), score_terms)
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
