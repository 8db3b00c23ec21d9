"""MiniMax-M2 (`minimax_m2`) on the GPU: a small checkpoint of its shape (whole-projection q/k
norms, rotary on half of each head, a sigmoid router whose selection bias matters) written
by transformers' `save_pretrained`: fp32 on the GPU against transformers' fp32 logits, the
same greedy tokens for every expert residency and with graphs off (bf16, the Triton
kernels: the fused norms, the sigmoid router's GEMV and launch); and a slice of
random:minimax-m2 at its real layer shape at fp8 under a cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_family import assert_fp32_matches_transformers, assert_residencies_agree, assert_slice_runs_under_cap
from hf_saved import save

from edgemoe.testing.isolation import isolated

transformers = pytest.importorskip("transformers")

E = 16
SMALL = dict(
    vocab_size=151936, hidden_size=256, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, num_local_experts=E, num_experts_per_tok=4,
    rotary_dim=32, pad_token_id=None, eos_token_id=None, bos_token_id=None,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(**SMALL))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a buffer: save's rescaling does not reach it; N(0, 0.5²) reorders the scores
        for layer in model.model.layers:
            layer.mlp.e_score_correction_bias.copy_(0.5 * torch.randn(E, generator=g))
    return save(model, tmp_path_factory.mktemp("minimax"))


def test_fp32_on_the_gpu_matches_transformers(ckpt: Path) -> None:
    assert_fp32_matches_transformers(ckpt, SMALL["hidden_size"])


def test_offload_and_graphs_give_resident_tokens(ckpt: Path) -> None:
    assert_residencies_agree(ckpt)


@isolated  # measures the driver-counted device memory of a fresh process
def test_a_slice_of_the_real_shape_at_fp8_runs_under_the_cap() -> None:
    assert_slice_runs_under_cap("random:minimax-m2?num_hidden_layers=4", 8, expert_dtype="fp8")
