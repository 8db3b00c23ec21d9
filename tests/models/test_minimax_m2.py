"""MiniMax-M2 (`minimax_m2`) against transformers' `MiniMaxM2ForCausalLM`: checkpoints written by
its own `save_pretrained` (MiniMax's published names: `block_sparse_moe.experts.E.w1/w3/w2`,
`block_sparse_moe.e_score_correction_bias`), the same weights in transformers' module names
(stacked `mlp.experts.gate_up_proj`), a config.json in the published spelling (`rotary_dim`,
`rope_theta`, MiniMax's own fields) and an FP8 checkpoint in the published layout. The tiny
config takes every branch: q/k norms over the whole projection, rotary on half of each head
(and on the whole), a selection bias large enough to change the experts chosen."""

from __future__ import annotations

import json
import math
import shutil
from fnmatch import fnmatch
from pathlib import Path

import backend_tokens
import pytest
import torch
from hf_saved import assert_greedy_matches_transformers, save, transformers_logits
from hf_saved import assert_logits_match as assert_logits_match_on
from safetensors.torch import load_file, save_file
from tolerances import network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.kernels.router_sigmoid import SigmoidRouter, route_grouped_sigmoid
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.minimax_m2 import ROUTING
from edgemoe.models.registry import model_arch
from edgemoe.testing.checkpoint import write_tokenizer_files

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
E = 8
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, num_local_experts=E,
            num_experts_per_tok=3, rotary_dim=8, pad_token_id=None)


def minimax(bias: float = 0.5, **overrides: object) -> transformers.MiniMaxM2ForCausalLM:
    """A tiny model with a selection bias of scale `bias`: sigmoid scores of unit-scale logits
    lie around 0.5 ± 0.2, so N(0, 0.5²) reorders them (`test_the_selection_bias_changes_the_choices`)."""
    model = transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(**{**TINY, **overrides}))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a buffer, not a parameter: `save`'s rescaling does not reach it
        for layer in model.model.layers:
            layer.mlp.e_score_correction_bias.copy_(bias * torch.randn(E, generator=g))
    return model


def assert_logits_match(path: Path, theirs: torch.Tensor | None = None) -> None:
    assert_logits_match_on(path, SEQ, transformers_logits(path, SEQ) if theirs is None else theirs)


def stored_names(path: Path) -> set[str]:
    return {n for f in path.glob("*.safetensors") for n in load_file(f)}


def copy_beside(src: Path, out: Path, skip: tuple[str, ...] = ("*.safetensors*",)) -> Path:
    """`out` with `src`'s files but those matching a pattern of `skip` (default: the weights)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not any(fnmatch(f.name, pattern) for pattern in skip):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(minimax(), tmp_path_factory.mktemp("minimax"))


def test_save_pretrained_writes_the_published_names_and_matches_transformers(saved: Path) -> None:
    names = stored_names(saved)
    assert {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.e_score_correction_bias",
            "model.layers.1.block_sparse_moe.experts.7.w3.weight", "model.layers.1.self_attn.q_norm.weight"} <= names
    assert not any(".mlp." in n for n in names)
    assert model_arch(json.loads((saved / "config.json").read_text())).rope.rotary_dim == 8
    assert_logits_match(saved)


def test_full_head_rotary_matches_transformers(tmp_path: Path) -> None:
    """No `rotary_dim` (the class default): every dim of a head rotates."""
    path = save(minimax(rotary_dim=None), tmp_path)
    assert model_arch(json.loads((path / "config.json").read_text())).rope.rotary_dim == 16
    assert_logits_match(path)


def test_greedy_tokens_match_transformers(saved: Path) -> None:
    """Decode steps read the K/V (normed, half-rotated keys) that prefill wrote."""
    assert_greedy_matches_transformers(saved, [SEQ[:5], SEQ])


def test_the_selection_bias_changes_the_choices(saved: Path, tmp_path: Path) -> None:
    """The bias only chooses (the weights are the plain scores): transformers' logits move
    with it only where it changed some token's experts, and ours follow."""
    tensors = load_file(saved / "model.safetensors")
    unbiased = {k: torch.zeros_like(v) if k.endswith("e_score_correction_bias") else v for k, v in tensors.items()}
    path = copy_beside(saved, tmp_path)
    save_file(unbiased, path / "model.safetensors", metadata={"format": "pt"})
    with_bias, without = transformers_logits(saved, SEQ), transformers_logits(path, SEQ)
    assert (with_bias - without).abs().max() > 100 * network_atol(torch.float32, 48, with_bias.abs().max().item())
    assert_logits_match(path, without)


def test_transformers_module_names_load_the_same(saved: Path, tmp_path: Path) -> None:
    """`save_pretrained(save_original_format=False)`: `mlp.gate`, `mlp.e_score_correction_bias`
    and the stacked `mlp.experts.gate_up_proj` / `down_proj` (transformers 5's in-memory names)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    model.save_pretrained(tmp_path, save_original_format=False)
    write_tokenizer_files(tmp_path)
    names = stored_names(tmp_path)
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.e_score_correction_bias",
            "model.layers.0.mlp.gate.weight"} <= names and not any("block_sparse_moe" in n for n in names)
    with LLM(str(saved), dtype="float32") as llm:
        want = llm.prompt_logits(SEQ)
    with LLM(str(tmp_path), dtype="float32") as llm:
        assert torch.equal(llm.prompt_logits(SEQ), want)  # the same weights in the same banks


PUBLISHED_FIELDS = {  # MiniMax's own config.json fields, which transformers does not read
    "attn_type_list": [1, 1], "mtp_transformer_layers": 1, "num_mtp_modules": 3, "qk_norm_type": "per_layer",
    "scoring_func": "sigmoid", "shared_intermediate_size": 0, "use_mtp": True, "use_qk_norm": True,
    "use_routing_bias": True,
}


def as_published(config: dict[str, object], dtype: str = "float32") -> dict[str, object]:
    """A saved config.json rewritten as MiniMax publishes theirs: `rope_theta` and `rotary_dim`
    at the top level (no `rope_parameters`), `torch_dtype`, and MiniMax's own fields."""
    drop = ("rope_parameters", "dtype", "transformers_version")
    return {**{k: v for k, v in config.items() if k not in drop}, "rope_theta": 5000000, "rotary_dim": 8,
            "torch_dtype": dtype, "transformers_version": "4.46.1", **PUBLISHED_FIELDS}


def test_the_published_config_spelling_reads_rotary_dim(saved: Path, tmp_path: Path) -> None:
    path = copy_beside(saved, tmp_path, skip=("config.json",))
    published = as_published(json.loads((saved / "config.json").read_text()))
    (path / "config.json").write_text(json.dumps(published))
    theirs = transformers.AutoConfig.from_pretrained(path)
    assert theirs.rope_parameters["partial_rotary_factor"] == 0.5  # transformers reads rotary_dim too
    assert model_arch(published).rope.rotary_dim == 8
    assert_logits_match(path)


@pytest.mark.parametrize(("spelling", "rotary"), [
    ({"rotary_dim": 8}, 8),
    ({"rotary_dim": 8, "partial_rotary_factor": 0.25}, 4),  # a top-level factor wins
    ({"rotary_dim": 8, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}}, 16),
    ({"rotary_dim": 4, "head_dim": 8}, 4),
    ({}, 16),
])
def test_rotary_dim_yields_to_a_factor_as_in_transformers(spelling: dict[str, object], rotary: int) -> None:
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2RotaryEmbedding

    raw = {**{k: v for k, v in TINY.items() if k != "rotary_dim"}, "model_type": "minimax_m2", **spelling}
    config = transformers.MiniMaxM2Config.from_dict({k: v for k, v in raw.items() if k != "model_type"})
    assert MiniMaxM2RotaryEmbedding(config).inv_freq.numel() * 2 == rotary
    assert model_arch(raw).rope.rotary_dim == rotary


def fp8_blocks(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] → (e4m3 [N, K], weight_scale_inv [ceil(N/B), ceil(K/B)] fp32): each block
    scaled so its largest value is e4m3's 448, as DeepSeek's and MiniMax's FP8 releases are."""
    n, k = w.shape
    rows, cols = math.ceil(n / block), math.ceil(k / block)
    padded = torch.zeros(rows * block, cols * block)
    padded[:n, :k] = w
    tiles = padded.view(rows, block, cols, block)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0  # [rows, cols]
    q = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(rows * block, cols * block)[:n, :k]
    return q.contiguous(), scale


def dequantised(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    n, k = q.shape
    return q.float() * scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]


def quantised_linear(name: str) -> bool:
    """What MiniMax quantises: every linear but the router and the LM head
    (`modules_to_not_convert`: gate, e_score_correction_bias, lm_head)."""
    return name.endswith(("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight"))


def write_published_fp8(src: Path, out: Path, twin: Path, block: int) -> None:
    """`src` as MiniMax publishes it (FP8 linears with block scales, bf16 elsewhere, the bias
    fp32, the published config.json at `out`), and at `twin` its dequantised fp32 twin."""
    tensors, fp8, dense = load_file(src / "model.safetensors"), {}, {}
    for name, t in tensors.items():
        if quantised_linear(name):
            q, s = fp8_blocks(t, block)
            fp8[name], fp8[name.replace(".weight", ".weight_scale_inv")] = q, s
            dense[name] = dequantised(q, s, block)
        else:
            fp8[name] = t if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
            dense[name] = fp8[name].float()
    config = json.loads((src / "config.json").read_text())
    qc = {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
          "weight_block_size": [block, block], "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}
    for path, weights, cfg in ((out, fp8, {**as_published(config, "bfloat16"), "quantization_config": qc}),
                               (twin, dense, as_published(config))):
        copy_beside(src, path, skip=("*.safetensors*", "config.json"))
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
        (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("block", [128, 16])  # as published (one block a tiny matrix), and blocks that split them
def test_a_published_fp8_checkpoint_matches_its_dequantised_twin(saved: Path, tmp_path: Path, block: int) -> None:
    out, twin = tmp_path / "fp8", tmp_path / "twin"
    write_published_fp8(saved, out, twin, block)
    with LLM(str(out), dtype="float32") as llm:
        assert llm._engine().runtime.plan.expert_format == f"fp8 e4m3 ({block}x{block} blocks)"  # stayed fp8
        ours = llm.prompt_logits(SEQ)
    theirs = transformers_logits(twin, SEQ)
    torch.testing.assert_close(ours, theirs, atol=network_atol(torch.float32, 48, theirs.abs().max().item()), rtol=0)


def test_router_matches_transformers_on_many_rows() -> None:
    """Our sigmoid router (one group, no scale, renormalised) against transformers' on 500
    rows of 16 experts with a bias that reorders them."""
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

    config = transformers.MiniMaxM2Config(**{**TINY, "num_local_experts": 16, "num_experts_per_tok": 4})
    gate = MiniMaxM2TopKRouter(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(16, 32, generator=g) / 6)
        bias = 0.3 * torch.randn(16, generator=g)
        x = torch.randn(500, 32, generator=g)
        _, weights, ids = gate(x, bias)
    our_ids, our_weights = route_grouped_sigmoid(x, SigmoidRouter(gate.weight, bias, ROUTING), 4, True)
    order, our_order = ids.sort(dim=-1), our_ids.long().sort(dim=-1)
    assert torch.equal(order.values, our_order.values)
    torch.testing.assert_close(our_weights.gather(1, our_order.indices), weights.gather(1, order.indices))


@pytest.fixture(scope="module")
def resident_tokens(saved: Path) -> list[list[int]]:
    """The resident executor's greedy tokens: one run, shared by every backend's test."""
    return backend_tokens.resident(saved, SEQ)


@pytest.mark.parametrize("settings", backend_tokens.OFFLOAD_AND_HYBRID, ids=lambda s: s["moe_backend"])
def test_backends_give_resident_tokens(saved: Path, resident_tokens: list[list[int]],
                                       settings: dict[str, object]) -> None:
    """Prompts prefilled in chunks through the slot-addressed executors: the resident tokens."""
    got, misses = backend_tokens.backend(saved, SEQ, **settings)
    assert got == resident_tokens
    assert min(misses) > 0  # 3 or 4 slots for 8 experts: every layer missed


def published_config(**overrides: object) -> dict[str, object]:
    """A tiny config as MiniMax publishes one: `rotary_dim` decides the rotary dims."""
    saved = transformers.MiniMaxM2Config(**TINY).to_dict()
    return {**as_published(saved), **overrides}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"rotary_dim": 7}, "rotary_dim=7"),
    ({"rotary_dim": 32}, "rotary_dim=32"),
    ({"rotary_dim": 0}, "rotary_dim=0"),
    ({"num_local_experts": 2}, "num_local_experts"),  # fewer than the top-3
    ({"num_local_experts": 1, "num_experts_per_tok": 1}, "num_local_experts=1"),
    ({"scoring_func": "softmax"}, "scoring_func='softmax'"),
    ({"use_qk_norm": False}, "use_qk_norm=False"),
    ({"qk_norm_type": "per_head"}, "qk_norm_type='per_head'"),
    ({"shared_intermediate_size": 16}, "shared_intermediate_size=16"),
    ({"attn_type_list": [0, 1]}, "attn_type_list"),
])
def test_configs_it_cannot_run_are_refused_by_name(overrides: dict[str, object], named: str) -> None:
    assert model_arch(published_config()).rope.rotary_dim == 8
    with pytest.raises(ConfigError, match=named):
        model_arch(published_config(**overrides))


def test_the_real_preset_has_minimax_m2s_shape_as_transformers_reads_it() -> None:
    from edgemoe.engine.budget import dense_weight_bytes
    from edgemoe.models.presets import parse_random

    preset = parse_random("random:minimax-m2").config
    theirs = transformers.MiniMaxM2Config.from_dict({k: v for k, v in preset.items() if k != "model_type"})
    a = model_arch(preset)
    assert (a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim) == (62, 3072, 48, 8, 128)
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.store_experts, a.vocab_size) == (256, 8, 1536, 256,
                                                                                                 200064)
    assert a.rope.rotary_dim == 64 == int(128 * theirs.rope_parameters["partial_rotary_factor"])
    assert a.rope.theta == theirs.rope_parameters["rope_theta"] == 5e6
    assert a.max_position_embeddings == theirs.max_position_embeddings == 196608
    n = sum(torch.Size(s).numel() for s in a.param_shapes().values())
    routers = 62 * 256 * (3072 + 1)  # weight and bias of every layer's router, kept fp32
    assert dense_weight_bytes(a) == 2 * n + 2 * routers


def test_the_tiny_preset_generates() -> None:
    with LLM("random:tiny-minimax-m2", dtype="float32") as llm:
        out = llm.generate([SEQ], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6
