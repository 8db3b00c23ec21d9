"""The shared expert's appended pair compiled, on the GPU, at Qwen3.8's shape (H = 2048,
top-10, the shared expert 512) against the reference: routed pairs bitwise, the gate within
one rounding of bf16 (its logit's too)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from edgemoe.kernels.shared_gate import append_shared, append_shared_ref

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_append_shared_matches_reference(tokens: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, generator=g, device="cuda").to(torch.bfloat16)
    gate = (torch.randn(1, 2048, generator=g, device="cuda") / 45).to(torch.bfloat16)
    ids = torch.randint(0, 512, (tokens, 10), generator=g, device="cuda", dtype=torch.int32)
    weights = torch.rand(tokens, 10, generator=g, device="cuda")
    got_ids, got_w = append_shared(x, gate, ids, weights, 512)
    want_ids, want_w = append_shared_ref(x, gate, ids, weights, 512)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_w[:, :10], want_w[:, :10])
    eps, logit = torch.finfo(torch.bfloat16).eps, F.linear(x.float(), gate.float()).abs()
    assert ((got_w[:, 10:] - want_w[:, 10:]).abs() <= eps * (want_w[:, 10:] + logit / 4) + 1e-30).all()
