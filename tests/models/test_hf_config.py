"""config.json read as transformers reads it: our per-family schemas against transformers'
config classes, aliases, RoPE standardisation of every spelling, and the context length."""

from __future__ import annotations

import importlib

import pytest

from edgemoe.models.hf_config import (
    SCHEMAS,
    ConfigError,
    HFConfig,
    context_length,
    rope_parameters,
    rope_spec,
)
from edgemoe.models.registry import model_module
from edgemoe.testing.checkpoint import model_config

transformers = pytest.importorskip("transformers")
CONFIG_MAPPING = transformers.models.auto.configuration_auto.CONFIG_MAPPING


# Aliases a transformers release after the pinned one added (our schema reads checkpoints
# either writes): checked against the installed one only where it has them.
NEWER_ALIASES = {"ernie4_5_moe": {"num_mtp_layers"}}  # 5.25


@pytest.mark.parametrize("model_type", sorted(SCHEMAS))
def test_schema_is_transformers_config_class(model_type: str) -> None:
    cls = CONFIG_MAPPING[model_type]
    schema = SCHEMAS[model_type]
    ours = {k: v for k, v in schema.attribute_map.items()
            if k in cls.attribute_map or k not in NEWER_ALIASES.get(model_type, ())}
    assert ours == cls.attribute_map
    assert schema.default_theta == cls.default_theta
    # An empty config.json standardises to the class defaults (theta, partial factor, yarn default).
    default = cls()
    assert rope_parameters(HFConfig({"model_type": model_type}), default.max_position_embeddings) == (
        default.rope_parameters
    )


SPELLINGS = [
    {"rope_theta": 500000.0},
    {"rope_theta": 500000.0, "rope_scaling": None},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}},
    {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                         "rope_theta": 1e6, "beta_fast": 8}},
    {"rope_theta": 1e4, "partial_rotary_factor": 0.75},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
     "partial_rotary_factor": 0.75},
    {"max_position_embeddings": 8192, "original_max_position_embeddings": 2048,
     "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}},
]


@pytest.mark.parametrize("model_type", sorted(SCHEMAS))
@pytest.mark.parametrize("spelling", range(len(SPELLINGS)))
def test_rope_spellings_standardise_as_transformers(model_type: str, spelling: int) -> None:
    raw = {"model_type": model_type, **SPELLINGS[spelling]}
    theirs = CONFIG_MAPPING[model_type](**{k: v for k, v in raw.items() if k != "model_type"})
    theirs.standardize_rope_params()  # what the rope init functions call first
    assert rope_parameters(HFConfig(raw), theirs.max_position_embeddings) == theirs.rope_parameters


@pytest.mark.parametrize("model_type,partial", [("qwen3_moe", False), ("olmoe", False), ("mixtral", False),
                                                 ("qwen3_next", True), ("glm4_moe", True), ("minimax_m2", True),
                                                 ("ernie4_5_moe", False), ("gpt_oss", False)])
def test_which_families_rotate_part_of_a_head(model_type: str, partial: bool) -> None:
    """Llama-style modeling code ignores partial_rotary_factor; the hybrids honour it. (gpt-oss's
    default rope ignores it too: we rotated half of each head, its logits off by ~2.)"""
    rope = {"rope_type": "default", "rope_theta": 1e4}
    config = CONFIG_MAPPING[model_type](hidden_size=64, num_attention_heads=4, head_dim=16, partial_rotary_factor=0.5,
                                        rope_parameters=rope)
    stem = {"qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe", "mixtral": "Mixtral", "qwen3_next": "Qwen3Next",
            "glm4_moe": "Glm4Moe", "minimax_m2": "MiniMaxM2", "ernie4_5_moe": "Ernie4_5_Moe",
            "gpt_oss": "GptOss"}[model_type]
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    theirs = getattr(module, f"{stem}RotaryEmbedding")(config).inv_freq.numel() * 2
    mine = rope_spec(HFConfig(config.to_dict()), 16, config.max_position_embeddings).rotary_dim
    assert SCHEMAS[model_type].partial_rotary is partial
    assert mine == theirs == (8 if partial else 16)


def test_alias_is_read_under_either_name() -> None:
    for key in ("num_experts", "num_local_experts"):
        c = HFConfig({"model_type": "qwen3_moe", key: 8})
        assert c.get("num_experts") == c.get("num_local_experts") == c.require("num_experts") == 8
    c = HFConfig({"model_type": "deepseek_v3", "n_routed_experts": 256})
    assert c.get("num_local_experts") == 256 and "num_local_experts" in c


def test_alias_conflict_and_absence_are_named() -> None:
    c = HFConfig({"model_type": "mixtral", "num_experts": 8, "num_local_experts": 16})
    with pytest.raises(ConfigError, match=r"num_local_experts=16 and num_experts=8.*disagree"):
        c.get("num_experts")
    assert HFConfig({"model_type": "mixtral", "num_experts": 8, "num_local_experts": 8}).get("num_experts") == 8
    with pytest.raises(ConfigError, match=r"no 'num_local_experts' nor 'num_experts'.*qwen3_moe"):
        HFConfig({"model_type": "qwen3_moe"}).require("num_experts")


QWEN3_30B = dict(max_position_embeddings=40960, hidden_size=2048, num_attention_heads=32, head_dim=128)


@pytest.mark.parametrize("rope_scaling,context", [
    (None, 40960),
    # Qwen's documented YaRN for Qwen3-30B-A3B: 32,768 x 4
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
    ({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}, 65536),
    ({"rope_type": "linear", "factor": 2.0}, 81920),
    ({"rope_type": "dynamic", "factor": 4.0}, 40960),  # transformers rescales per batch past 40,960
])
def test_context_length_follows_rope_scaling(rope_scaling, context: int) -> None:  # noqa: ANN001
    arch = model_module("qwen3_moe").arch(model_config("qwen3_moe", **QWEN3_30B, rope_scaling=rope_scaling))
    assert arch.max_position_embeddings == context
    assert arch.rope.rope_type == (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))


@pytest.mark.parametrize("model_type,context", [("gpt_oss", 131072), ("deepseek_v3", 163840)])
def test_context_length_where_max_position_embeddings_is_already_scaled(model_type: str, context: int) -> None:
    raw = {"model_type": model_type, "max_position_embeddings": context}
    if model_type == "deepseek_v3":
        raw["rope_scaling"] = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                               "mscale": 1.0, "mscale_all_dim": 1.0}
    spec = rope_spec(HFConfig(raw), 64, context)
    assert spec.rope_type == "yarn" and context_length(spec) == context


@pytest.mark.parametrize("rope,match", [
    ({"rope_type": "llama3", "factor": 8.0}, r"'llama3' is not supported \(supported: default, linear, dynamic, yarn\)"),
    ({"rope_type": "linear"}, r"'linear' needs rope_parameters.factor"),
    ({"rope_type": "default", "partial_rotary_factor": 0.3}, r"rotary dim 19 of head_dim 64"),
])
def test_unsupported_rope_is_refused_by_name(rope: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        rope_spec(HFConfig({"model_type": "qwen3_next", "rope_parameters": rope}), 64, 4096)


@pytest.mark.parametrize("raw,match", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 1e30, "original_max_position_embeddings": 32768}},
     r"original_max_position_embeddings x factor = 3.28e\+34 positions"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 1e9}}, r"max_position_embeddings x rope_parameters.factor"),
    ({"max_position_embeddings": 2**40}, r"^max_position_embeddings = 1.1e\+12 positions"),
])
def test_a_context_past_int32_positions_is_refused_by_name(raw: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=match):
        model_module("qwen3_moe").arch(model_config("qwen3_moe", **{**QWEN3_30B, **raw}))
