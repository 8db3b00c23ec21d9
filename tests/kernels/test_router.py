"""The fused router against transformers' Qwen3-MoE routing (reference) and the Triton
kernel (interpreter on CPU) against the reference."""

from __future__ import annotations

import os

import pytest
import torch

from edgemoe.kernels.router import route_topk_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def logits(T: int, E: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Distinct logits per row (bf16 ties would make any top-k order right): a random
    permutation of integers, exact in bf16 up to 256, scaled by a power of two."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(E, generator=g) - E // 2 for _ in range(T)]
    return (torch.stack(rows).float() * (8 / E)).to(dtype)


@pytest.mark.parametrize("renormalize", [True, False])
def test_reference_is_transformers_routing(renormalize: bool) -> None:
    mod = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
    torch.manual_seed(0)
    x = logits(7, 16, torch.bfloat16, 1)
    # Qwen3MoeTopKRouter: softmax (fp32), topk, renormalise, cast to the hidden dtype.
    cfg = mod.Qwen3MoeConfig(hidden_size=16, num_experts=16, num_experts_per_tok=4, norm_topk_prob=renormalize)
    router = mod.Qwen3MoeTopKRouter(cfg).to(torch.bfloat16)
    with torch.no_grad():
        router.weight.copy_(torch.eye(16, dtype=torch.bfloat16))  # logits = x
        _, want_w, want_ids = router(x)
    ids, w = route_topk_ref(x, 4, renormalize, torch.bfloat16)
    assert torch.equal(ids.long(), want_ids) and torch.equal(w, want_w.float())


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("E,K", [(128, 8), (60, 4), (512, 8), (8, 2), (512, 10), (60, 5), (128, 3)])  # K padded: 10, 5, 3
@pytest.mark.parametrize("renormalize", [True, False])
def test_triton_matches_reference(E: int, K: int, renormalize: bool) -> None:
    from edgemoe.kernels.triton_ops.router import route_topk_triton

    x = logits(9, E, torch.bfloat16, E + K)
    ids, w = route_topk_triton(x, K, renormalize, torch.bfloat16)
    want_ids, want_w = route_topk_ref(x, K, renormalize, torch.bfloat16)
    assert torch.equal(ids, want_ids)
    # fp32 softmax with another exp: the weights agree to a rounding of bf16 (2^-8 relative).
    assert ((w - want_w).abs() <= 2**-8 * want_w.abs()).all()
