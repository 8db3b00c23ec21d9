"""DeepSeek-V2 (`deepseek_v2`) on the GPU: the grouped router's softmax mode compiled (one
Triton program a token) against its torch reference at the released shapes (V2-Lite's 64
experts top-6 greedy; V2's 160 experts in 8 groups of which 3 are kept), then a small
V2-Lite-shaped checkpoint written by transformers' `save_pretrained`: fp32 on the GPU against
transformers' fp32 logits, and the same greedy tokens for every expert residency and with
graphs off (bf16, the Triton kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_family import assert_fp32_matches_transformers, assert_residencies_agree
from hf_saved import save

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=151936, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=8, q_lora_rank=None, kv_lora_rank=128, qk_nope_head_dim=48,
    qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=2,
    first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
    pad_token_id=None, eos_token_id=None, bos_token_id=None,
)


@pytest.mark.parametrize(("experts", "top_k", "groups", "kept", "scale"), [(64, 6, 1, 1, 1.0), (160, 6, 8, 3, 16.0)])
def test_softmax_route_launch_equals_the_torch_routing(experts: int, top_k: int, groups: int, kept: int,
                                                       scale: float) -> None:
    from edgemoe.kernels.router_sigmoid import GroupedSigmoid, SigmoidRouter, route_scores_ref, with_shared
    from edgemoe.kernels.triton_ops.router_sigmoid import sigmoid_route_triton

    g = torch.Generator(device="cuda").manual_seed(experts)
    logits = 2 * torch.randn(300, experts, device="cuda", generator=g)
    router = SigmoidRouter(torch.empty(experts, 1), None, GroupedSigmoid(groups, kept, scale, softmax=True), experts)
    want = with_shared(*route_scores_ref(logits, router, top_k, False), experts)
    got = sigmoid_route_triton(logits, None, top_k, False, groups, kept, scale, experts, softmax=True)
    assert torch.equal(got[0], want[0])
    # exp, the row's sum and a division: a few ulps of fp32 apart from torch's softmax
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=8 * 2**-23)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**SMALL))
    return save(model, tmp_path_factory.mktemp("dsv2"))


def test_fp32_on_the_gpu_matches_transformers(ckpt: Path) -> None:
    assert_fp32_matches_transformers(ckpt, SMALL["intermediate_size"])


def test_offload_and_graphs_give_resident_tokens(ckpt: Path) -> None:
    assert_residencies_agree(ckpt)
