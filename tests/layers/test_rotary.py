"""RoPE tables against transformers 5.24 (and 5.25): each family's own RotaryEmbedding (default,
linear, dynamic, YaRN in its variants, partial rotary), and rotate-half on a partial slice."""

from __future__ import annotations

import importlib

import pytest
import torch
from tolerances import rounding_atol

from edgemoe.kernels.rotary import apply_rope
from edgemoe.layers.rotary import Rotary
from edgemoe.models.hf_config import HFConfig, context_length, rope_spec

transformers = pytest.importorskip("transformers")

QWEN3_30B = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128, rope_theta=1e6)
YARN_QWEN3 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
CASES = {
    "default": ("qwen3_moe", dict(QWEN3_30B, max_position_embeddings=40960)),
    "linear": ("qwen3_moe", dict(QWEN3_30B, rope_scaling={"rope_type": "linear", "factor": 2.5})),
    "dynamic": ("qwen3_moe", dict(QWEN3_30B, max_position_embeddings=40960,
                                  rope_scaling={"rope_type": "dynamic", "factor": 3.0})),
    "yarn-qwen3": ("qwen3_moe", dict(QWEN3_30B, max_position_embeddings=40960, rope_scaling=YARN_QWEN3)),
    "yarn-betas-untruncated": ("qwen3_moe", dict(QWEN3_30B, rope_scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
        "beta_fast": 16, "beta_slow": 2, "truncate": False})),
    "yarn-mscale": ("qwen3_moe", dict(QWEN3_30B, max_position_embeddings=163840, rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "mscale": 0.707, "mscale_all_dim": 1.0})),
    "yarn-attention-factor": ("qwen3_moe", dict(QWEN3_30B, rope_scaling=dict(YARN_QWEN3, attention_factor=1.5))),
    "yarn-factor-from-lengths": ("qwen3_moe", dict(QWEN3_30B, max_position_embeddings=131072, rope_scaling={
        "rope_type": "yarn", "factor": None, "original_max_position_embeddings": 32768})),
    "partial-default": ("qwen3_next", dict(head_dim=64, rope_theta=1e7)),  # partial_rotary_factor 0.25 by default
    "partial-yarn": ("qwen3_next", dict(head_dim=64, rope_parameters=dict(YARN_QWEN3, partial_rotary_factor=0.5))),
    "glm4-partial": ("glm4_moe", dict(head_dim=128)),  # 0.5 by default
    "gpt-oss-yarn": ("gpt_oss", {}),  # yarn, truncate=False, by default
}
HF_ROTARY = {"qwen3_moe": "Qwen3Moe", "qwen3_next": "Qwen3Next", "glm4_moe": "Glm4Moe", "gpt_oss": "GptOss"}


def hf_config(model_type: str, kwargs: dict):  # noqa: ANN201
    return transformers.AutoConfig.for_model(model_type, **kwargs)


def hf_rotary(config):  # noqa: ANN001, ANN201
    """The family's own RotaryEmbedding, built as its model builds it."""
    mt = config.model_type
    module = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    return getattr(module, f"{HF_ROTARY[mt]}RotaryEmbedding")(config)


def ours(config) -> Rotary:  # noqa: ANN001
    """Our Rotary, read from the JSON transformers would save for this config."""
    c = HFConfig(config.to_dict())
    head_dim = c.get("head_dim") or c.get("hidden_size") // c.get("num_attention_heads")
    return Rotary(rope_spec(c, head_dim, c.get("max_position_embeddings")), torch.device("cpu"))


@pytest.fixture(scope="module", params=list(CASES))
def pair(request):  # noqa: ANN001, ANN201
    model_type, kwargs = CASES[request.param]
    config = hf_config(model_type, kwargs)
    return hf_rotary(config), ours(config)


def test_inv_freq_and_attention_factor_are_exact(pair) -> None:  # noqa: ANN001
    theirs, mine = pair
    assert mine.attention_factor == theirs.attention_scaling
    assert torch.equal(mine.inv_freq, theirs.inv_freq)  # same expressions, same fp32 rounding


POSITIONS = torch.tensor([0, 1, 2, 7, 100, 4095, 4096, 32767, 32768, 40959, 131071])


def test_cos_sin_match_the_models_rotary_embedding(pair) -> None:  # noqa: ANN001
    theirs, mine = pair
    # NOTE: within the context we serve (dynamic NTK: the native length, where transformers
    # has not started rescaling per batch).
    positions = POSITIONS[POSITIONS < context_length(mine.spec)]
    with torch.no_grad():
        cos, sin = theirs(torch.zeros(1, dtype=torch.float32), positions[None, :])
    half = mine.rotary_dim // 2
    got_cos, got_sin = mine.cos_sin(positions, torch.float32)
    table_cos, table_sin = mine.cos_sin_table(int(positions.max()) + 1)
    assert table_cos.shape == (int(positions.max()) + 1, half) and table_cos.dtype == torch.float32
    # cos/sin are accurate to 1 ulp (2 roundings' worth) whichever vector lane computes them,
    # then scaled by the attention factor (1 rounding): 3 roundings at |value| <= factor.
    atol = rounding_atol(torch.float32, 3, mine.attention_factor)
    if cos.shape[-1] == half:  # gpt-oss keeps the half-width layout of our table
        torch.testing.assert_close(table_cos[positions], cos[0], rtol=0, atol=atol)
        torch.testing.assert_close(table_sin[positions], sin[0], rtol=0, atol=atol)
        return
    # rotate-half layout: identical expressions on the same layout, bit for bit
    assert torch.equal(got_cos, cos[0]) and torch.equal(got_sin, sin[0])
    torch.testing.assert_close(table_cos[positions], cos[0, :, :half], rtol=0, atol=atol)
    torch.testing.assert_close(table_sin[positions], sin[0, :, :half], rtol=0, atol=atol)


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
def test_partial_rotary_matches_transformers_rotate_half(factor: float) -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb

    config = hf_config("qwen3_next", dict(head_dim=64, partial_rotary_factor=factor))
    rotary = ours(config)
    assert rotary.rotary_dim == int(64 * factor)
    g = torch.Generator().manual_seed(0)
    T, H = 6, 3
    q, k = torch.randn(T, H, 64, generator=g), torch.randn(T, 2, 64, generator=g)
    positions = torch.tensor([0, 1, 5, 17, 300, 9000])
    cos, sin = rotary.cos_sin(positions, torch.float32)
    # transformers' layout: q/k [B, heads, T, D], cos/sin [B, T, R]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    # elementwise only (no reductions): the same roundings in any layout
    assert torch.equal(apply_rope(q, cos, sin), want_q[0].transpose(0, 1))
    assert torch.equal(apply_rope(k, cos, sin), want_k[0].transpose(0, 1))
    assert torch.equal(apply_rope(q, cos, sin)[..., rotary.rotary_dim :], q[..., rotary.rotary_dim :])

