"""The shared expert's appended pair: the reference is transformers' gate then the
concatenations; the Triton kernel (interpreter on CPU) copies the routed pairs bitwise and
computes the gate within one rounding of x's dtype."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from edgemoe.kernels.shared_gate import append_shared, append_shared_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def inputs(T: int, H: int, K: int, dtype: torch.dtype, seed: int):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate = (torch.randn(1, H, generator=g) / H**0.5).to(dtype)
    ids = torch.randint(0, 64, (T, K), generator=g, dtype=torch.int32)
    weights = torch.rand(T, K, generator=g).to(dtype).float()
    return x, gate, ids, weights


def test_reference_is_the_gate_then_the_pair() -> None:
    x, gate, ids, weights = inputs(3, 40, 4, torch.bfloat16, 0)
    got_ids, got_w = append_shared_ref(x, gate, ids, weights, 64)
    assert torch.equal(got_ids[:, :4], ids) and (got_ids[:, 4] == 64).all() and got_ids.dtype == torch.int32
    assert torch.equal(got_w[:, :4], weights)
    assert torch.equal(got_w[:, 4:], torch.sigmoid(F.linear(x, gate)).float())  # transformers' gate, in x's dtype
    assert torch.equal(append_shared(x, gate, ids, weights, 64)[1], got_w)  # on a CPU the dispatcher is the reference


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize(("T", "H", "K"), [(1, 2048, 10), (5, 100, 8), (3, 4100, 3)])  # 4100: three loads along H
def test_triton_matches_reference(T: int, H: int, K: int) -> None:
    from edgemoe.kernels.triton_ops.shared_gate import append_shared_triton

    x, gate, ids, weights = inputs(T, H, K, torch.bfloat16, T + H)
    got_ids, got_w = append_shared_triton(x, gate, ids, weights, 512)
    want_ids, want_w = append_shared_ref(x, gate, ids, weights, 512)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_w[:, :K], want_w[:, :K])
    # the logit's fp32 sum in another order may round to the neighbouring bf16; sigmoid's slope ≤ 1/4
    eps = torch.finfo(torch.bfloat16).eps
    logit = F.linear(x.float(), gate.float()).abs()
    assert ((got_w[:, K:] - want_w[:, K:]).abs() <= eps * (want_w[:, K:] + logit / 4) + 1e-30).all()
