"""`random:PRESET?field=value` parsing: canonical names, typed overrides, clear refusals."""

from __future__ import annotations

import pytest

from edgemoe.models.presets import PRESETS, RandomSpec, is_random, parse_random
from edgemoe.models.registry import model_module


def test_qwen3_30b_a3b_preset_has_the_published_shape() -> None:
    # The numbers from Qwen/Qwen3-30B-A3B's model card and config.json.
    a = model_module("qwen3_moe").arch(parse_random("random:qwen3-30b-a3b").config)
    assert (a.hidden_size, a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim) == (2048, 48, 32, 4, 128)
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.vocab_size) == (128, 8, 768, 151936)
    assert a.moe_layers == tuple(range(48)) and a.norm_topk_prob and not a.tie_word_embeddings
    assert (a.rope.theta, a.max_position_embeddings, a.rms_norm_eps, str(a.dtype)) == (1e6, 40960, 1e-6, "torch.bfloat16")
    coder = model_module("qwen3_moe").arch(parse_random("random:qwen3-coder-30b-a3b").config)
    assert (coder.rope.theta, coder.max_position_embeddings) == (1e7, 262144)
    assert coder.param_shapes() == model_module("qwen3_moe").arch(PRESETS["qwen3-30b-a3b"]).param_shapes()


def test_overrides_are_typed_sorted_and_canonical() -> None:
    spec = parse_random("random:qwen3-30b-a3b?num_hidden_layers=12&rms_norm_eps=1e-5,mlp_only_layers=[0,1],seed=7")
    assert spec == RandomSpec("qwen3-30b-a3b", (("mlp_only_layers", [0, 1]), ("num_hidden_layers", 12),
                                                ("rms_norm_eps", 1e-5)), seed=7)
    assert spec.name == "random:qwen3-30b-a3b?mlp_only_layers=[0,1],num_hidden_layers=12,rms_norm_eps=1e-05,seed=7"
    assert parse_random(spec.name) == spec  # the canonical name parses back to the same spec
    assert spec.config["num_hidden_layers"] == 12 and PRESETS["qwen3-30b-a3b"]["num_hidden_layers"] == 48
    assert parse_random("random:tiny-qwen3-moe").name == "random:tiny-qwen3-moe"
    assert parse_random("random:qwen3-30b-a3b?rope_theta=2").config["rope_theta"] == 2.0  # int accepted as float
    # A JSON object value (commas inside braces stay in it) reaches the model file's config reader.
    yarn = parse_random('random:qwen3-30b-a3b?rope_scaling={"rope_type":"yarn","factor":4.0},num_hidden_layers=2')
    rope = model_module("qwen3_moe").arch(yarn.config).rope
    assert (rope.rope_type, rope.factor, yarn.config["num_hidden_layers"]) == ("yarn", 4.0, 2)
    assert is_random("random:x") and not is_random("/models/x") and not is_random(None)


def test_dir_names_are_readable_or_a_digest() -> None:
    assert parse_random("random:tiny-qwen3-moe?num_hidden_layers=3").dir_name == "tiny-qwen3-moe@num_hidden_layers=3"
    odd = parse_random("random:tiny-qwen3-moe?hidden_act=../x y").dir_name
    assert odd.startswith("tiny-qwen3-moe@") and "/" not in odd and " " not in odd


@pytest.mark.parametrize(("text", "message"), [
    ("random:nope", r"unknown preset 'nope'; known: deepseek-v2-lite, ernie-4.5-21b-a3b, glm-4.5-air, glm-4.7-flash, gpt-oss-120b, gpt-oss-20b, minimax-m2, qwen3-30b-a3b, qwen3-coder-30b-a3b, qwen3.5-35b-a3b, qwen3.8-flash-next, tiny-deepseek-v2-lite, tiny-ernie-4.5, tiny-glm-4.7-flash, tiny-glm4-moe, tiny-gpt-oss, tiny-minimax-m2, tiny-qwen3-moe, tiny-qwen3.5-moe, tiny-qwen3.8-flash-next"),
    ("random:tiny-qwen3-moe?num_layers=2", r"unknown field 'num_layers' for preset 'tiny-qwen3-moe'; known: .*num_hidden_layers"),
    ("random:tiny-qwen3-moe?num_hidden_layers=0", r"num_hidden_layers must be >= 1 \(got 0\)"),
    ("random:tiny-qwen3-moe?num_hidden_layers=1.5", r"num_hidden_layers=1.5 must be int"),
    ("random:tiny-qwen3-moe?norm_topk_prob=1", r"norm_topk_prob=1 must be bool"),
    ("random:tiny-qwen3-moe?torch_dtype=16", r"torch_dtype=16 must be str"),
    ("random:tiny-qwen3-moe?seed=-1", r"seed must be an integer >= 0"),
    ("random:tiny-qwen3-moe?seed=1,seed=2", r"'seed' given twice"),
    ("random:tiny-qwen3-moe?hidden_size", r"'hidden_size' is not key=value"),
    ("random:tiny-qwen3-moe?num_experts=1", r"num_experts_per_tok 2 > num_experts 1"),
    ("random:tiny-ernie-4.5?moe_num_experts=1", r"num_experts_per_tok 2 > num_experts 1"),  # ERNIE's spellings
    ("random:tiny-ernie-4.5?moe_k=0", r"moe_k must be >= 1 \(got 0\)"),
    ("random:tiny-qwen3-moe?num_key_value_heads=3", r"num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
])
def test_bad_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"model \(--model\) .*" + message):
        parse_random(text)
