"""ERNIE-4.5 MoE (`ernie4_5_moe`) against transformers' `Ernie4_5_MoeForCausalLM`: checkpoints
written by its own `save_pretrained` (Baidu's published names: `mlp.moe_statics.e_score_correction_bias`
[1, E], per-expert `mlp.experts.E.*`, `mlp.shared_experts.*`), and the same weights in
transformers' module names. The tiny config takes every branch: interleaved rotary over heads
of 16 (head_dim given), a dense first layer, the softmax router with a selection bias large
enough to change the experts chosen, two shared experts beside the bank. Variants: no shared
expert, one (in the bank), MoE layers placed by start / end / interval, tied embeddings (the
class default), YaRN, a `moe_norm_min` that clamps. Also: the
router alone on many rows, greedy tokens through the cache, offload and hybrid, the MTP
weights skipped, refusals by name, the presets and the chat template."""

from __future__ import annotations

import json
from pathlib import Path

import backend_tokens
import pytest
import torch
from hf_saved import assert_greedy_matches_transformers, scale_weights, served_chat, transformers_logits
from hf_saved import assert_logits_match as assert_logits_match_on
from safetensors.torch import load_file, save_file
from tolerances import network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.kernels.router_sigmoid import SigmoidRouter, route_grouped_sigmoid
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.registry import model_arch
from edgemoe.testing.checkpoint import write_tokenizer_files

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
E = 8
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
            moe_num_experts=E, moe_k=3, moe_num_shared_experts=2, tie_word_embeddings=False, pad_token_id=None)
VARIANTS = {
    "no-shared-experts": {"moe_num_shared_experts": 0},
    "one-shared-expert-in-the-bank": {"moe_num_shared_experts": 1},
    # (i + 1) % 2 == 0 and 0 <= i <= 3: layers 1 and 3 sparse, 0, 2 and 4 dense
    "moe-layers-by-start-end-interval": {"num_hidden_layers": 5, "moe_layer_start_index": 0, "moe_layer_end_index": 3,
                                         "moe_layer_interval": 2},
    # the class default (and ERNIE-4.5-21B-A3B's); a tied head repeats a token's own embedding: no greedy test here
    "tied": {"tie_word_embeddings": True},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                 "rope_theta": 500000.0}},
    # the chosen scores of 3 of 8 experts sum to less than 0.9 on most tokens: no renormalisation there
    "norm-min-clamps": {"moe_norm_min": 0.9},
}


def ernie(**overrides: object) -> transformers.Ernie4_5_MoeForCausalLM:
    return transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**{**TINY, **overrides}))


def save(model: transformers.Ernie4_5_MoeForCausalLM, out: Path, bias: float = 0.1) -> Path:
    """`hf_saved.save` with the selection bias set after the rescaling (a parameter: it would be
    N(0, 1/E) there) to N(0, `bias`²): softmax scores of unit-scale logits over 8 experts lie
    around 0.12 ± 0.1, so it reorders near ties (`test_the_selection_bias_changes_the_choices`)."""
    scale_weights(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.moe_statics.e_score_correction_bias.copy_(bias * torch.randn(1, E, generator=g))
    model.tie_weights()
    model.save_pretrained(out)
    write_tokenizer_files(out)
    return out


def assert_logits_match(path: Path, theirs: torch.Tensor | None = None) -> None:
    """Our fp32 logits are transformers' to fp32's reduction bound (`hf_saved`)."""
    assert_logits_match_on(path, SEQ, transformers_logits(path, SEQ) if theirs is None else theirs)


def stored(path: Path) -> dict[str, torch.Tensor]:
    return {n: t for f in sorted(path.glob("*.safetensors")) for n, t in load_file(f).items()}


def rewrite(src: Path, out: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """`src`'s files at `out` with `tensors` as its weights (one file)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.startswith("model"):
            (out / f.name).write_bytes(f.read_bytes())
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(ernie(), tmp_path_factory.mktemp("ernie"))


def test_save_pretrained_writes_baidus_names_and_matches_transformers(saved: Path) -> None:
    tensors = stored(saved)
    assert tensors["model.layers.1.mlp.moe_statics.e_score_correction_bias"].shape == (1, E)
    assert {"model.layers.1.mlp.gate.weight", "model.layers.2.mlp.experts.7.up_proj.weight",
            "model.layers.1.mlp.shared_experts.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"} <= set(tensors)
    a = model_arch(json.loads((saved / "config.json").read_text()))
    assert (a.moe_layers, a.tie_word_embeddings, a.head_dim, a.shared_intermediate_size) == ((1, 2), False, 16, 32)
    assert_logits_match(saved)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_match_transformers(variant: str, tmp_path: Path) -> None:
    path = save(ernie(**VARIANTS[variant]), tmp_path)
    assert ("lm_head.weight" in stored(path)) == (variant != "tied")
    assert_logits_match(path)


@pytest.mark.parametrize("overrides", [
    {}, {"moe_layer_start_index": 0}, {"moe_layer_interval": 2}, {"moe_layer_interval": 3, "moe_layer_start_index": 0},
    {"moe_layer_end_index": 3}, {"moe_layer_start_index": 2, "moe_layer_end_index": 4, "moe_layer_interval": 1},
], ids=str)
def test_moe_layers_are_those_transformers_builds(overrides: dict[str, int]) -> None:
    config = transformers.Ernie4_5_MoeConfig(**{**TINY, "num_hidden_layers": 6, **overrides})
    model = transformers.Ernie4_5_MoeForCausalLM(config)
    theirs = tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate"))
    assert model_arch(config.to_dict()).moe_layers == theirs


def test_greedy_tokens_match_transformers(saved: Path) -> None:
    """Decode steps read the K/V (keys in the reordered rotary layout) that prefill wrote."""
    assert_greedy_matches_transformers(saved, [SEQ[:5], SEQ])


def test_the_selection_bias_changes_the_choices(saved: Path, tmp_path: Path) -> None:
    """The bias only chooses (the weights are the plain scores): transformers' logits move
    with it only where it changed some token's experts, and ours follow."""
    unbiased = {k: torch.zeros_like(v) if k.endswith("e_score_correction_bias") else v
                for k, v in stored(saved).items()}
    path = rewrite(saved, tmp_path, unbiased)
    with_bias, without = transformers_logits(saved, SEQ), transformers_logits(path, SEQ)
    assert (with_bias - without).abs().max() > 100 * network_atol(torch.float32, 48, with_bias.abs().max().item())
    assert_logits_match(path, without)


def test_transformers_module_names_load_the_same(saved: Path, tmp_path: Path) -> None:
    """`save_pretrained(save_original_format=False)`: `mlp.gate.moe_statics.e_score_correction_bias`
    and the stacked `mlp.experts.gate_up_proj` / `down_proj`."""
    model = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    model.save_pretrained(tmp_path, save_original_format=False)
    write_tokenizer_files(tmp_path)
    names = set(stored(tmp_path))
    assert {"model.layers.1.mlp.gate.moe_statics.e_score_correction_bias",
            "model.layers.1.mlp.experts.gate_up_proj"} <= names and not any(".mlp.moe_statics." in n for n in names)
    with LLM(str(saved), dtype="float32") as llm:
        want = llm.prompt_logits(SEQ)
    with LLM(str(tmp_path), dtype="float32") as llm:
        assert torch.equal(llm.prompt_logits(SEQ), want)  # the same weights in the same places


def test_the_mtp_weights_are_skipped(saved: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Baidu's checkpoints carry an MTP block (`model.mtp_*`), which transformers does not read."""
    H = TINY["hidden_size"]
    mtp = {"model.mtp_block.0.input_layernorm.weight": torch.ones(H), "model.mtp_emb_norm.0.weight": torch.ones(H),
           "model.mtp_hidden_norm.0.weight": torch.ones(H), "model.mtp_linear_proj.0.weight": torch.zeros(H, 2 * H)}
    path = rewrite(saved, tmp_path, {**stored(saved), **mtp})
    with LLM(str(saved), dtype="float32") as llm:
        want = llm.prompt_logits(SEQ)
    with caplog.at_level("WARNING"), LLM(str(path), dtype="float32") as llm:
        assert torch.equal(llm.prompt_logits(SEQ), want)
    assert "unexpected" not in caplog.text


@pytest.mark.parametrize("norm_min", [1e-12, 0.8])
def test_router_matches_transformers_on_many_rows(norm_min: float) -> None:
    """Our router (the grouped router's softmax mode with a selection bias) against transformers'
    Ernie4_5_MoeTopKRouter on 500 rows of 16 experts, top-4; a norm_min of 0.8 clamps the
    renormalisation on many rows (their weights then sum to less than 1)."""
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    config = transformers.Ernie4_5_MoeConfig(**{**TINY, "moe_num_experts": 16, "moe_k": 4, "moe_norm_min": norm_min})
    gate = Ernie4_5_MoeTopKRouter(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(16, 32, generator=g) / 3)
        gate.moe_statics.e_score_correction_bias.copy_(0.05 * torch.randn(1, 16, generator=g))
        x = torch.randn(500, 32, generator=g)
        logits, weights, ids = gate(x)
    spec = model_arch(config.to_dict()).sigmoid_routing
    assert spec is not None and spec.softmax and spec.selection_bias and spec.norm_min == norm_min
    bias = gate.moe_statics.e_score_correction_bias.detach().squeeze(0)
    our_ids, our_weights = route_grouped_sigmoid(x, SigmoidRouter(gate.weight.detach(), bias, spec), 4, True)
    order, our_order = ids.sort(dim=-1), our_ids.long().sort(dim=-1)  # transformers' top-k order is its own
    assert torch.equal(order.values, our_order.values)
    # Each weight: exp within an ulp, a sum of 16 exps, the division, the sum of 4 and the division.
    torch.testing.assert_close(our_weights.gather(1, our_order.indices), weights.gather(1, order.indices),
                               atol=0, rtol=2 * (16 + 8) * 2**-24)
    plain = logits.softmax(-1).topk(4).indices.sort(dim=-1).values
    assert (plain != order.values).any(dim=-1).sum() > 25  # the bias changed many rows' experts
    assert ((weights.sum(-1) < 0.99).sum() > 25) == (norm_min == 0.8)  # the clamp acted where asked


@pytest.fixture(scope="module")
def resident_tokens(saved: Path) -> list[list[int]]:
    """The resident executor's greedy tokens: one run, shared by every backend's test."""
    return backend_tokens.resident(saved, SEQ)


@pytest.mark.parametrize("settings", backend_tokens.OFFLOAD_AND_HYBRID, ids=lambda s: s["moe_backend"])
def test_backends_give_resident_tokens(saved: Path, resident_tokens: list[list[int]],
                                       settings: dict[str, object]) -> None:
    """Experts copied into 3-4 slots or computed on the CPU, prompts prefilled in chunks: the
    resident executor's greedy tokens (the shared experts stay beside the bank)."""
    got, misses = backend_tokens.backend(saved, SEQ, **settings)
    assert got == resident_tokens
    assert misses[0] == 0 and min(misses[1:]) > 0  # 3 or 4 slots for 8 experts: every MoE layer missed


def config(**overrides: object) -> dict[str, object]:
    return {**transformers.Ernie4_5_MoeConfig(**TINY).to_dict(), **overrides}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"use_bias": True}, "use_bias=true"),
    ({"moe_gate_act": "sigmoid"}, "moe_gate_act='sigmoid'"),
    ({"moe_layer_start_index": 3}, "moe_layer_start_index=3"),  # past the last of 3 layers: no MoE layer
    ({"moe_layer_end_index": 0}, "moe_layer_end_index=0"),
    ({"moe_layer_end_index": -2}, "moe_layer_end_index=-2"),
    ({"moe_layer_interval": 0}, "moe_layer_interval=0"),
    ({"moe_layer_interval": 4}, "moe_layer_interval=4"),
    ({"moe_k": 9}, "moe_k=9 .*moe_num_experts"),  # more than the 8 experts
    ({"moe_k": 0}, "moe_k=0"),  # named as the file spells it (the message said num_experts_per_tok)
    ({"moe_num_shared_experts": -1}, "moe_num_shared_experts=-1"),
    ({"moe_norm_min": -1e-12}, "moe_norm_min"),
    ({"moe_num_experts": [8, 8]}, "moe_num_experts"),  # ERNIE-4.5-VL's text and vision experts
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
])
def test_configs_it_cannot_serve_are_refused_by_name(overrides: dict[str, object], named: str) -> None:
    assert model_arch(config()).moe_layers == (1, 2)
    with pytest.raises(ConfigError, match=r"config\.json: .*" + named.replace("(", r"\(")):
        model_arch(config(**overrides))


def test_a_null_end_index_is_the_last_layer() -> None:
    """Baidu's code reads a null `moe_layer_end_index` as the last layer (transformers fails on it)."""
    assert model_arch(config(moe_layer_end_index=None)).moe_layers == model_arch(config()).moe_layers == (1, 2)


def test_the_21b_preset_has_the_published_shape_as_transformers_reads_it() -> None:
    from edgemoe.engine.budget import dense_weight_bytes
    from edgemoe.models.presets import parse_random

    preset = parse_random("random:ernie-4.5-21b-a3b").config
    theirs = transformers.Ernie4_5_MoeConfig.from_dict({k: v for k, v in preset.items() if k != "model_type"})
    a = model_arch(preset)
    assert (a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim) == (28, 2560, 20, 4, 128)
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.shared_intermediate_size) == (64, 6, 1536, 3072)
    assert (a.moe_layers, a.dense_layers, a.intermediate_size) == (tuple(range(1, 28)), (0,), 12288)
    assert (a.num_experts, a.top_k) == (theirs.moe_num_experts, theirs.moe_k)
    assert a.rope.theta == theirs.rope_parameters["rope_theta"] == 500000
    assert a.max_position_embeddings == theirs.max_position_embeddings == 131072
    assert a.tie_word_embeddings and theirs.tie_word_embeddings and a.store_experts == 64  # shared: beside the bank
    n = sum(torch.Size(s).numel() for s in a.param_shapes().values())
    routers = 27 * 64 * (2560 + 1)  # weight and selection bias of every MoE layer's router, kept fp32
    assert dense_weight_bytes(a) == 2 * n + 2 * routers


def test_the_300b_shape_reads() -> None:
    """ERNIE-4.5-300B-A47B's shape (as we know its config.json, not checked against the Hub
    here): MoE from layer 3 to the last, top-8 of 64 experts of width 3,584, untied."""
    c = {"model_type": "ernie4_5_moe", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 54,
         "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 103424, "moe_num_experts": 64,
         "moe_k": 8, "moe_intermediate_size": 3584, "moe_num_shared_experts": 0, "moe_layer_start_index": 3,
         "moe_layer_end_index": 53, "moe_layer_interval": 1, "rope_theta": 500000, "rms_norm_eps": 1e-5,
         "max_position_embeddings": 131072, "tie_word_embeddings": False, "use_bias": False,
         "torch_dtype": "bfloat16"}
    a = model_arch(c)
    assert (a.moe_layers, a.dense_layers, a.head_dim, a.top_k) == (tuple(range(3, 54)), (0, 1, 2), 128, 8)
    assert (a.shared_intermediate_size, a.tie_word_embeddings, a.store_experts) == (0, False, 64)
    experts = len(a.moe_layers) * 64 * 3 * 3584 * 8192
    assert 280e9 < experts < 300e9  # ~290B of its 300B parameters are routed experts


def test_the_tiny_preset_generates() -> None:
    with LLM("random:tiny-ernie-4.5", dtype="float32") as llm:
        out = llm.generate([SEQ], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6


# ERNIE-4.5-*-PT's chat template, as we know the published one (not checked against the Hub file
# here): `cls_token` / `sep_token` default to ERNIE's markers where the tokenizer names none.
PT_TEMPLATE = (
    '{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = true -%}{%- endif -%}'
    '{%- if not cls_token is defined -%}{%- set cls_token = "<|begin_of_sentence|>" -%}{%- endif -%}'
    '{%- if not sep_token is defined -%}{%- set sep_token = "<|end_of_sentence|>" -%}{%- endif -%}'
    '{{- cls_token -}}{%- for message in messages -%}'
    '{%- if message["role"] == "user" -%}{{- "User: " + message["content"] + "\n" -}}'
    '{%- elif message["role"] == "assistant" -%}{{- "Assistant: " + message["content"] + sep_token -}}'
    '{%- elif message["role"] == "system" -%}{{- message["content"] + "\n" -}}{%- endif -%}{%- endfor -%}'
    '{%- if add_generation_prompt -%}{{- "Assistant: " -}}{%- endif -%}'
)


def test_the_pt_chat_template_renders_as_transformers_and_picks_no_parser(tmp_path: Path) -> None:
    write_tokenizer_files(tmp_path)  # Qwen3's tokenizer: it names no cls / sep token, as ERNIE's names its defaults
    tok_cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "chat_template": PT_TEMPLATE}))
    (tmp_path / "chat_template.jinja").write_text(PT_TEMPLATE)
    served, ours, theirs = served_chat(tmp_path, "ernie4_5_moe", 151936, [151645])
    assert ours == ("<|begin_of_sentence|>Be brief.\nUser: Hi\nAssistant: Hello.<|end_of_sentence|>User: 2+2?\n"
                    "Assistant: ")
    assert ours == theirs
    # No tool format in the template and none by default for the family; no <think> blocks.
    assert (served.tool_parser, served.reasoning, served.teaches_calls) == (None, False, False)


def test_the_routers_stay_fp32_in_a_bf16_model(saved: Path) -> None:
    """transformers keeps the router's weight and selection bias fp32 in a bf16 model
    (`_keep_in_fp32_modules_strict`), and so do we (the bias decides near ties)."""
    theirs = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.bfloat16)
    fp32 = {n for n, t in theirs.named_parameters() if t.dtype == torch.float32}
    kept = ("weight", "moe_statics.e_score_correction_bias")
    assert fp32 == {f"model.layers.{i}.mlp.gate.{w}" for i in (1, 2) for w in kept}
    a = model_arch({**json.loads((saved / "config.json").read_text()), "dtype": "bfloat16"})
    assert a.dtype == torch.bfloat16
    assert a.param_dtypes() == {f"layers.{i}.{n}": torch.float32 for i in (1, 2) for n in ("router", "router_bias")}
