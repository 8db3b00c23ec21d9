"""ERNIE-4.5 MoE (`ernie4_5_moe`) on the GPU: a small checkpoint of its shape (interleaved
rotary de-interleaved at build, a softmax router with a selection bias that matters, two
shared experts, the first layer dense) written by transformers' `save_pretrained`: fp32 on
the GPU against transformers' fp32 logits, the same greedy tokens for every expert
residency and with graphs off (bf16: the router's GEMV and Triton launch, the Triton
attention); and a slice of random:ernie-4.5-21b-a3b at fp8 under a cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_family import assert_fp32_matches_transformers, assert_residencies_agree, assert_slice_runs_under_cap
from hf_saved import scale_weights

from edgemoe.testing.checkpoint import write_tokenizer_files
from edgemoe.testing.isolation import isolated

transformers = pytest.importorskip("transformers")

E = 16
SMALL = dict(
    vocab_size=151936, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, moe_num_experts=E,
    moe_k=4, moe_num_shared_experts=2, moe_layer_start_index=1, tie_word_embeddings=False, pad_token_id=None,
    eos_token_id=None, bos_token_id=None,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**SMALL))
    scale_weights(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # after the rescaling: softmax scores over 16 experts, reordered near ties
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.moe_statics.e_score_correction_bias.copy_(0.05 * torch.randn(1, E, generator=g))
    out = tmp_path_factory.mktemp("ernie")
    model.save_pretrained(out)
    write_tokenizer_files(out)
    return out


def test_fp32_on_the_gpu_matches_transformers(ckpt: Path) -> None:
    assert_fp32_matches_transformers(ckpt, SMALL["intermediate_size"])


def test_offload_and_graphs_give_resident_tokens(ckpt: Path) -> None:
    assert_residencies_agree(ckpt)


@isolated  # measures the driver-counted device memory of a fresh process
def test_a_slice_of_the_real_shape_at_fp8_runs_under_the_cap() -> None:
    assert_slice_runs_under_cap("random:ernie-4.5-21b-a3b?num_hidden_layers=6", 6, expert_dtype="fp8")
