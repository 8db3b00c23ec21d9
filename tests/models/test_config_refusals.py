"""What we cannot serve is refused at load, by a message naming config.json and the field:
never wrong outputs, never a traceback. Configs come from transformers 5.24's own config
classes (`to_dict()`, what `save_pretrained` writes), then one field set the way a
publisher (or an attacker) might."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from edgemoe.cli import main
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.loader import CheckpointError, checkpoint_scheme
from edgemoe.models.registry import model_arch
from edgemoe.testing.checkpoint import write_tokenizer_files

transformers = pytest.importorskip("transformers")

WHERE = "/models/m/config.json"
TINY = dict(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8)
HYBRID = dict(TINY, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
              layer_types=["linear_attention", "full_attention"])


def config(model_type: str, **fields: Any) -> dict[str, Any]:
    """transformers' config for `model_type` (tiny), as saved, then `fields` written over it."""
    if model_type == "qwen3_moe":
        c = transformers.Qwen3MoeConfig(**TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    elif model_type == "olmoe":
        c = transformers.OlmoeConfig(**{k: v for k, v in TINY.items() if k != "head_dim"}, num_experts=4,
                                     num_experts_per_tok=2)
    elif model_type == "mixtral":
        c = transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2)
    elif model_type == "qwen3_next":
        c = transformers.Qwen3NextConfig(**HYBRID)
    else:
        c = transformers.Qwen3_5MoeTextConfig(**HYBRID)
    return {**c.to_dict(), **fields}


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        model_arch(raw, WHERE)
    return str(e.value)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "olmoe", "qwen3_next", "qwen3_5_moe_text"])
def test_attention_bias_is_refused(model_type: str) -> None:
    """OLMoE's biased projections used to load with the biases dropped (a warning, wrong logits)."""
    message = refusal(config(model_type, attention_bias=True))
    assert message.startswith(f"{WHERE}: attention_bias=true") and model_type in message


def test_qwen3_next_without_a_shared_expert_is_refused() -> None:
    assert refusal(config("qwen3_next", shared_expert_intermediate_size=0)).startswith(
        f"{WHERE}: shared_expert_intermediate_size=0")


YARN = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4, "original_max_position_embeddings": 64}
# (model_type, field, value): each failed with a raw Python error (or at the first token:
# topk past the experts), or was read silently as something else (a string flag, a string
# list, yarn without its factor).
BAD_VALUES = [
    ("qwen3_moe", "num_hidden_layers", "2"),
    ("qwen3_moe", "num_hidden_layers", None),
    ("qwen3_moe", "decoder_sparse_step", 0),  # ZeroDivisionError
    ("qwen3_moe", "num_experts_per_tok", 5),  # more than the 4 experts: torch.topk failed at the first token
    ("qwen3_moe", "num_experts_per_tok", 0),
    ("qwen3_moe", "mlp_only_layers", [0, 1]),  # every layer dense: the expert store failed on min([])
    ("qwen3_moe", "num_local_experts", 0),
    ("qwen3_moe", "num_key_value_heads", 3),  # 4 heads
    ("qwen3_moe", "max_position_embeddings", 0),
    ("qwen3_moe", "mlp_only_layers", "0"),  # read as no dense layer
    ("qwen3_moe", "tie_word_embeddings", "yes"),  # read as true
    ("qwen3_moe", "rms_norm_eps", "1e-6"),
    ("qwen3_moe", "rope_parameters", [10000.0]),
    ("qwen3_moe", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4}),  # transformers refuses it too
    ("qwen3_moe", "rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}),
    ("qwen3_moe", "hidden_act", "relu2"),
    ("olmoe", "clip_qkv", "8"),
    ("mixtral", "sliding_window", 0),
    ("qwen3_next", "layer_types", "linear_attention"),
    ("qwen3_5_moe_text", "layer_types", 2),  # a TypeError caught, naming no field
    ("olmoe", "num_attention_heads", 64),  # more heads than hidden dims: refused as a rotary dim of 0
    ("olmoe", "head_dim", 16),  # not hidden / heads (8): a tensor-shape error; transformers' q/k norms fail on it
    ("qwen3_5_moe_text", "linear_conv_kernel_dim", 1),  # the conv state kernels failed (IndexError)
    # YaRN's options were not checked: a TypeError (a math domain error for a negative beta)
    # when the rotary tables were built, a string truncate read as true, and an
    # AssertionError out of model_arch for a null original length
    ("qwen3_moe", "rope_parameters", dict(YARN, beta_fast="32")),
    ("mixtral", "rope_parameters", dict(YARN, attention_factor="0.8")),
    ("olmoe", "rope_parameters", dict(YARN, mscale=[1.0], mscale_all_dim=1.0)),
    ("qwen3_next", "rope_parameters", dict(YARN, beta_slow=-1)),
    ("qwen3_moe", "rope_parameters", dict(YARN, truncate="false")),
    ("qwen3_5_moe_text", "rope_parameters", dict(YARN, original_max_position_embeddings=None)),
]


@pytest.mark.parametrize("model_type,field,value", BAD_VALUES, ids=lambda v: str(v))
def test_a_bad_value_is_refused_naming_the_file_and_field(model_type: str, field: str, value: Any) -> None:
    message = refusal(config(model_type, **{field: value}))
    assert message.startswith(f"{WHERE}: ") and field.split(".")[0] in message


@pytest.mark.parametrize("model_type", ["qwen3_moe", "olmoe", "mixtral"])
@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn"])
def test_partial_rotary_with_scaled_rope_on_a_whole_head_family_is_refused(model_type: str, rope_type: str) -> None:
    """Their default RoPE ignores partial_rotary_factor (whole heads rotate), but a scaled
    RoPE's frequencies cover only the partial dim, which their modeling cannot apply: we
    served it as whole-head rotation. Asked of transformers' own model (it fails too)."""
    rope = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    raw = config(model_type, rope_parameters=rope)
    assert refusal(raw).startswith(f"{WHERE}: partial_rotary_factor 0.5 with rope_type {rope_type!r}")
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**raw))
    with pytest.raises(RuntimeError, match="must match the size"):
        model(torch.tensor([[1, 2, 3]]))
    assert model_arch(config(model_type, partial_rotary_factor=0.5), WHERE).rope.rotary_dim == 8  # default: whole


def test_a_config_that_is_not_an_object_or_has_a_bad_quantization_config(tmp_path: Path) -> None:
    assert refusal([1, 2]).startswith(f"{WHERE}: expected a JSON object")  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match=r"config.json: quantization_config='fp8': expected an object"):
        checkpoint_scheme({**config("qwen3_moe"), "quantization_config": "fp8"}, WHERE)


@pytest.mark.parametrize("model_type", ["qwen3_5_moe", "qwen4_exp"])
@pytest.mark.parametrize("top,text", [(True, False), (False, True)])
def test_a_multimodal_model_ties_by_its_top_level_flag(model_type: str, top: bool, text: bool) -> None:
    """`save_pretrained` of a tied multimodal model writes true at the top and false in
    text_config; the other way round, the model does not tie. Asked of transformers' model."""
    small = dict(num_hidden_layers=2, hidden_size=32, vocab_size=64, num_experts=2, num_experts_per_tok=1,
                 eos_token_id=1, tie_word_embeddings=text)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, out_hidden_size=32, patch_size=4,
                  num_position_embeddings=16)
    hf_config = transformers.AutoConfig.for_model(model_type).__class__(
        text_config=small, vision_config=vision, tie_word_embeddings=top)
    with torch.device("meta"):  # the structure only, no weights
        model = transformers.AutoModelForImageTextToText.from_config(hf_config)
    tied = "lm_head.weight" in model.get_expanded_tied_weights_keys(all_submodels=True)
    assert model_arch(hf_config.to_dict(), WHERE).tie_word_embeddings is tied is top


def test_generate_reports_a_refused_config_as_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config("olmoe", attention_bias=True)))
    write_tokenizer_files(tmp_path)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--max-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'config.json'}: attention_bias=true" in err and "Traceback" not in err
