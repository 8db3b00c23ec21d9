"""Multi-head latent attention models against transformers: `glm4_moe_lite` (GLM-4.7-Flash)
and `deepseek_v3` (DeepSeek-V3 / R1, Kimi-K2), checkpoints written by its own `save_pretrained`.
The tiny configs take every branch: a low-rank query or one q projection, interleaved or
rotate-half rotary, YaRN's mscale in the softmax scale, biased projections, the dense first
layer and the DeepSeek-V3 MoE (two groups, one kept, a routed scale, the shared expert)."""

from __future__ import annotations

from pathlib import Path

import importlib.util
import os

import backend_tokens
import pytest
import torch
from hf_saved import assert_greedy_matches_transformers, save, transformers_logits
from hf_saved import assert_logits_match as assert_logits_match_on

from edgemoe import LLM, SamplingParams
from edgemoe.engine.budget import kv_bytes_per_token
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.registry import model_arch

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, q_lora_rank=24,
            kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, n_routed_experts=8,
            num_experts_per_tok=3, n_group=2, topk_group=1, routed_scaling_factor=2.5, n_shared_experts=1,
            norm_topk_prob=True, pad_token_id=None)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0,
        "mscale_all_dim": 1.0}
DEEPSEEK = {  # each a DeepSeek-V3 variant of the tiny config
    "low-rank-q": {},
    "one-q-projection": {"q_lora_rank": None},
    "yarn-mscale": {"rope_scaling": YARN},
    "rotate-half": {"rope_interleave": False},
    "biased": {"attention_bias": True},
    "biased-one-q-projection": {"attention_bias": True, "q_lora_rank": None},
}


def with_router_bias(model: torch.nn.Module) -> torch.nn.Module:
    """A non-zero selection bias (a buffer: `save`'s rescaling does not reach it)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.copy_(0.2 * torch.randn(TINY["n_routed_experts"], generator=g))
    return model


def glm_lite(**overrides: object) -> torch.nn.Module:
    config = transformers.Glm4MoeLiteConfig(**{**TINY, **overrides})
    return with_router_bias(transformers.Glm4MoeLiteForCausalLM(config))


def deepseek(**overrides: object) -> torch.nn.Module:
    config = transformers.DeepseekV3Config(**{**TINY, "first_k_dense_replace": 1, **overrides})
    return with_router_bias(transformers.DeepseekV3ForCausalLM(config))


def assert_logits_match(path: Path) -> None:
    assert_logits_match_on(path, SEQ, transformers_logits(path, SEQ))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(glm_lite(), tmp_path_factory.mktemp("glm_lite"))


def test_glm_lite_checkpoint_matches_transformers(saved: Path) -> None:
    assert_logits_match(saved)


@pytest.mark.parametrize("variant", sorted(DEEPSEEK))
def test_deepseek_v3_checkpoints_match_transformers(variant: str, tmp_path: Path) -> None:
    assert_logits_match(save(deepseek(**DEEPSEEK[variant]), tmp_path))


def test_greedy_tokens_match_transformers(saved: Path) -> None:
    """Decode steps read the latent cache (one row a token) that prefill wrote."""
    assert_greedy_matches_transformers(saved, [SEQ[:5], SEQ])


def test_the_cache_holds_one_latent_row_a_token(saved: Path) -> None:
    a = model_arch(transformers.Glm4MoeLiteConfig(**TINY).to_dict())
    assert (a.num_kv_heads, a.head_dim, a.shared_kv) == (1, 8 + 16, True)
    assert kv_bytes_per_token(a) == 3 * (8 + 16) * 2  # bf16, one plane: the value is the key
    with LLM(str(saved), dtype="float32") as llm:
        pool = llm.engine.runtime.pool
        assert pool.v is pool.k and len(pool.slot_tensors) == 1


@pytest.fixture(scope="module")
def resident_tokens(saved: Path) -> list[list[int]]:
    """The resident executor's greedy tokens: one run, shared by every backend's test."""
    return backend_tokens.resident(saved, SEQ)


@pytest.mark.parametrize("settings", [
    dict(moe_backend="cpu", moe_slots=3), *backend_tokens.OFFLOAD_AND_HYBRID,
    dict(moe_backend="resident", kv_cache_dtype="fp8"),
], ids=lambda s: s.get("kv_cache_dtype") or s["moe_backend"])
def test_backends_and_chunked_prefill_give_resident_tokens(saved: Path, resident_tokens: list[list[int]],
                                                           settings: dict[str, object]) -> None:
    """Every executor, prompts prefilled in chunks (later chunks attend to earlier chunks'
    latents), and the fp8 cache: the same greedy tokens (fp8 within its rounding: the
    same tokens on this model)."""
    assert backend_tokens.backend(saved, SEQ, **settings)[0] == resident_tokens


def test_cached_and_revived_prefixes_give_the_same_tokens(saved: Path) -> None:
    """A request reusing cached latent pages decodes as a fresh one; so do both after every
    page went to the host tier (one tensor a page: V is K's) and came back."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    longer = SEQ + [7, 8, 9]
    with LLM(str(saved), dtype="float32") as llm:
        fresh = [o.token_ids for o in llm.generate([SEQ, longer], greedy)]
    with LLM(str(saved), dtype="float32", page_size=8, host_cache="32MiB") as llm:
        assert llm.generate([SEQ], greedy)[0].token_ids == fresh[0]
        reused = llm.generate([longer], greedy)[0]
        assert reused.token_ids == fresh[1] and reused.num_cached_tokens >= 24
        cache = llm.engine.prefix_cache
        cache.evict(cache.total_pages)
        assert cache.total_pages == 0
        revived = llm.generate([SEQ, longer], greedy)
    assert [o.token_ids for o in revived] == fresh
    assert all(o.num_cached_tokens >= 24 for o in revived)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
                    reason="needs triton (interpreter, CPU-only machine)")
def test_the_triton_backend_reads_the_latent_cache_as_torch_does(saved: Path) -> None:
    """The Triton decode / extend kernels over one kv head of rope + kv_lora dims (24: padded
    to 32 in their tiles), K and V the same tensor, rotary from the spec's table by position."""
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    got = {}
    for backend in ("torch", "triton"):
        with LLM(str(saved), dtype="float32", attention_backend=backend) as llm:
            got[backend] = [o.token_ids for o in llm.generate([SEQ[:6], SEQ], greedy)]
    assert got["triton"] == got["torch"]


@pytest.mark.parametrize(("overrides", "named"), [
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ({"mlp_layer_types": ["dense", "dense", "dense"]}, "mlp_layer_types"),  # the message named other fields
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"n_group": 3}, "n_group=3"),
])
def test_configs_it_cannot_run_are_refused_by_name(overrides: dict[str, object], named: str) -> None:
    config = {**transformers.Glm4MoeLiteConfig(**TINY).to_dict(), **overrides}
    with pytest.raises(ConfigError, match=named):
        model_arch(config)


def test_dense_layers_follow_each_familys_field() -> None:
    lite = transformers.Glm4MoeLiteConfig(**{**TINY, "mlp_layer_types": ["dense", "dense", "sparse"]})
    assert model_arch(lite.to_dict()).moe_layers == (2,)
    v3 = transformers.DeepseekV3Config(**{**TINY, "first_k_dense_replace": 2}).to_dict()
    assert model_arch(v3).moe_layers == (2,)
    del v3["first_k_dense_replace"]
    with pytest.raises(ConfigError, match="first_k_dense_replace=3 leaves no MoE layer"):  # the default: 3 of 3 dense
        model_arch(v3)


def test_the_glm_4_7_flash_preset_plans_its_latent_cache() -> None:
    from edgemoe.models.presets import parse_random

    a = model_arch(parse_random("random:glm-4.7-flash").config)
    assert (a.num_layers, a.moe_layers[0], a.num_experts, a.top_k, a.head_dim) == (47, 1, 64, 4, 576)
    assert kv_bytes_per_token(a) == 47 * 576 * 2  # 54 KB a token: GQA of its 20 heads would be 20x that


def test_a_tiny_random_preset_generates() -> None:
    with LLM("random:tiny-glm-4.7-flash", dtype="float32") as llm:
        out = llm.generate([SEQ], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6


def test_convert_to_fp8_loads_as_its_source_quantised_at_load(saved: Path, tmp_path: Path) -> None:
    """`edgemoe convert --expert-dtype fp8` (DeepSeek's own FP8 layout: e4m3 blocks and
    `weight_scale_inv`) of an MLA checkpoint loads as the source quantised at load does."""
    from edgemoe.convert import convert

    out = convert(saved, "fp8", tmp_path / "out", progress=False)
    with LLM(str(saved), dtype="float32", expert_dtype="fp8") as llm:
        want = llm.prompt_logits(SEQ)
    with LLM(str(out), dtype="float32") as llm:
        assert torch.equal(llm.prompt_logits(SEQ), want)
