"""gpt-oss (`gpt_oss`) against transformers' `GptOssForCausalLM`: checkpoints written by its own
`save_pretrained` (experts stacked [E, H, 2I], gate/up interleaved, transposed), and the
same experts as the Hub publishes them in MXFP4 (`*_blocks` / `*_scales`, rows interleaved).
The tiny config takes every branch: biased q/k/v/o, sinks, a window shorter than the prompt
on two of three layers (not the default alternation), GQA 2, the biased router, biased
experts whose clamped SwiGLU clamps (a limit of 1.5 on unit-scale activations)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_saved import assert_greedy_matches_transformers, save
from safetensors.torch import load_file, save_file
from tolerances import network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.models.hf_config import ConfigError
from edgemoe.models.registry import model_arch

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))  # 28 tokens
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, num_local_experts=8,
            num_experts_per_tok=3, sliding_window=6, layer_types=["sliding_attention", "full_attention",
                                                                   "sliding_attention"],
            swiglu_limit=1.5, pad_token_id=None, eos_token_id=None, bos_token_id=None)


def gpt_oss(**overrides: object) -> transformers.GptOssForCausalLM:
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(**{**TINY, **overrides}))


def reference(path: Path, seq: list[int] = SEQ) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(torch.tensor([seq])).logits[0]


def ours(path: Path, **settings: object) -> torch.Tensor:
    with LLM(str(path), dtype="float32", **settings) as llm:
        return llm.prompt_logits(SEQ)


def assert_close_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    atol = network_atol(torch.float32, max(48, len(SEQ)), want.abs().max().item())
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(gpt_oss(), tmp_path_factory.mktemp("gpt_oss"))


def test_save_pretrained_checkpoint_matches_transformers(saved: Path) -> None:
    want = reference(saved)
    assert_close_logits(ours(saved), want)


def variant(saved: Path, out: Path, config: dict[str, object] | None = None,
            tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """A copy of `saved` with config fields and/or tensors replaced."""
    out.mkdir()
    for f in saved.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    if config:
        (out / "config.json").write_text(json.dumps({**json.loads((saved / "config.json").read_text()), **config}))
    if tensors:
        save_file({**load_file(saved / "model.safetensors"), **tensors}, out / "model.safetensors",
                  metadata={"format": "pt"})
    return out


def test_the_window_the_sinks_and_the_clamps_matter(saved: Path, tmp_path: Path) -> None:
    """The test's config reaches each feature: without it transformers' logits move."""
    want = reference(saved)
    no_sinks = {f"model.layers.{i}.self_attn.sinks": torch.full((4,), -1e4) for i in range(3)}
    for name, changed in [("window", variant(saved, tmp_path / "w", {"sliding_window": 4096})),
                          ("clamp", variant(saved, tmp_path / "c", {"swiglu_limit": 50.0})),
                          ("sinks", variant(saved, tmp_path / "s", tensors=no_sinks))]:
        assert (reference(changed) - want).abs().max() > 1e-3, name


def test_greedy_tokens_match_transformers(saved: Path) -> None:
    assert_greedy_matches_transformers(saved, [SEQ[:5], SEQ])


def hub_mxfp4(saved: Path, out: Path) -> Path:
    """The saved model as the Hub publishes gpt-oss: experts in MXFP4 blocks/scales with
    gate/up rows interleaved, the rest as saved; returns a directory whose bf16-free fp32
    checkpoint holds the dequantised experts (transformers' reference for it)."""
    from edgemoe.quant.mxfp4 import Mxfp4

    fmt, tensors = Mxfp4(), load_file(saved / "model.safetensors")
    hub, dequantised = {}, {}
    for name, t in tensors.items():
        if not name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            hub[name] = dequantised[name] = t
            continue
        rows = t.transpose(1, 2).float()  # [E, N, K] as F.linear reads it (gate/up interleaved: as stored)
        parts = [fmt.quantise(w) for w in rows]
        n, k = rows.shape[1:]
        hub[name + "_blocks"] = torch.stack([p[""] for p in parts]).reshape(len(parts), n, -1, 16)
        hub[name + "_scales"] = torch.stack([p["_scale"] for p in parts])
        dequantised[name] = torch.stack([fmt.dequantise(p, n, k) for p in parts]).transpose(1, 2).contiguous()
    for directory, weights in ((out / "hub", hub), (out / "dequantised", dequantised)):
        directory.mkdir()
        for f in saved.iterdir():
            if f.name != "model.safetensors":
                (directory / f.name).write_bytes(f.read_bytes())
        save_file({k: v.contiguous() for k, v in weights.items()}, directory / "model.safetensors",
                  metadata={"format": "pt"})
    config = json.loads((out / "hub" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                         "model.layers.*.mlp.router",
                                                                                         "model.embed_tokens", "lm_head"]}
    (out / "hub" / "config.json").write_text(json.dumps(config))
    return out


def test_hub_mxfp4_layout_loads_as_its_dequantised_weights(saved: Path, tmp_path: Path) -> None:
    out = hub_mxfp4(saved, tmp_path)
    assert_close_logits(ours(out / "hub"), reference(out / "dequantised"))


BACKEND_GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
BACKEND_PROMPTS = [SEQ[:6], SEQ]


@pytest.fixture(scope="module")
def resident_tokens(saved: Path) -> Callable[..., list[list[int]]]:
    """resident_tokens(**expert format) -> the resident executor's greedy tokens, one run
    per format, shared by the backends' tests."""
    runs: dict[tuple, list[list[int]]] = {}

    def get(**fmt: object) -> list[list[int]]:
        key = tuple(sorted(fmt.items()))
        if key not in runs:
            with LLM(str(saved), dtype="float32", moe_backend="resident", **fmt) as llm:
                runs[key] = [o.token_ids for o in llm.generate(BACKEND_PROMPTS, BACKEND_GREEDY)]
        return [list(t) for t in runs[key]]

    return get


@pytest.mark.parametrize("settings", [
    dict(moe_backend="offload", moe_slots=3),
    dict(moe_backend="cpu", moe_slots=3),
    dict(moe_backend="hybrid", moe_slots=4, moe_hybrid_fraction=0.5),
    dict(moe_backend="hybrid", moe_slots=4, moe_hybrid_fraction=0.5, expert_dtype="int8"),
], ids=lambda s: s["moe_backend"] + s.get("expert_dtype", ""))
def test_backends_give_resident_tokens(saved: Path, resident_tokens: Callable[..., list[list[int]]],
                                       settings: dict[str, object]) -> None:
    fmt = {"expert_dtype": settings["expert_dtype"]} if "expert_dtype" in settings else {}
    expected = resident_tokens(**fmt)
    with LLM(str(saved), dtype="float32", max_prefill_tokens=11, **settings) as llm:
        got = [o.token_ids for o in llm.generate(BACKEND_PROMPTS, BACKEND_GREEDY)]
        assert min(llm.stats()["moe"]["misses_per_token_by_layer"]) > 0
    assert got == expected


@pytest.mark.parametrize(("overrides", "named"), [
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ({"swiglu_limit": -1.0}, "swiglu_limit"),
])
def test_configs_it_cannot_run_are_refused_by_name(overrides: dict[str, object], named: str) -> None:
    config = {**transformers.GptOssConfig(**TINY).to_dict(), **overrides}
    with pytest.raises(ConfigError, match=named):
        model_arch(config)


def test_a_null_window_is_refused_where_a_layer_slides() -> None:
    """`sliding_window=None` (a valid value of GptOssConfig) with sliding layers loaded as
    plain causal attention; transformers' sliding mask raises on it, so nothing says that
    is the model. Without sliding layers the window is unread and the config loads."""
    config = transformers.GptOssConfig(**{**TINY, "sliding_window": None})
    with pytest.raises(ConfigError, match=r"sliding_window=null with sliding_attention layers"):
        model_arch(config.to_dict())
    model = transformers.GptOssForCausalLM(config).eval()
    with pytest.raises(ValueError, match="sliding_window"), torch.no_grad():  # its cache fails first (TypeError)
        model(torch.tensor([[1, 2, 3]]), use_cache=False)
    full = {**config.to_dict(), "layer_types": ["full_attention"] * 3}
    assert model_arch(full).layer_windows == (None, None, None)


@pytest.mark.parametrize("act", ["relu", "gelu_new"])
def test_hidden_act_is_not_read_as_transformers_does_not(act: str) -> None:
    """gpt-oss's experts are its clamped SwiGLU whatever `hidden_act` says: transformers'
    modelling never reads the field, so a checkpoint naming another loads as the default."""
    base = transformers.GptOssConfig(**TINY).to_dict()
    assert model_arch({**base, "hidden_act": act}) == model_arch(base)


def test_the_published_shapes() -> None:
    """The presets' arch: 20b and 120b as published (windows alternate from the first layer)."""
    from edgemoe.models.presets import parse_random

    small, big = (model_arch(parse_random(f"random:gpt-oss-{n}").config) for n in ("20b", "120b"))
    assert (small.num_layers, small.num_experts, small.top_k, small.moe_intermediate_size) == (24, 32, 4, 2880)
    assert (big.num_layers, big.num_experts) == (36, 128)
    assert small.layer_windows[:3] == (128, None, 128) and small.rope.rope_type == "yarn"
    sliced = model_arch(parse_random("random:gpt-oss-20b?num_hidden_layers=5").config)
    assert sliced.layer_windows == (128, None, 128, None, 128)


def test_convert_writes_the_published_mxfp4_layout(saved: Path, tmp_path: Path) -> None:
    """`edgemoe convert --expert-dtype mxfp4` writes gpt-oss's own tensors (gate/up rows and
    the gate_up bias interleaved): bitwise the Hub layout of the same quantisation, and it
    loads as the source quantised at load; int4's output loads the same way."""
    from edgemoe.convert import convert

    (tmp_path / "hub").mkdir()
    hub = load_file(hub_mxfp4(saved, tmp_path / "hub") / "hub" / "model.safetensors")
    out = convert(saved, "mxfp4", tmp_path / "mxfp4", progress=False)
    written: dict[str, torch.Tensor] = {}
    for f in out.glob("*.safetensors"):
        written |= load_file(f)
    assert set(written) == set(hub)
    for name, t in hub.items():
        assert torch.equal(written[name], t.to(written[name].dtype)), name
    for fmt, converted in (("mxfp4", out), ("int4", convert(saved, "int4", tmp_path / "int4", progress=False))):
        with LLM(str(saved), dtype="float32", expert_dtype=fmt) as llm:
            want = llm.prompt_logits(SEQ)
        with LLM(str(converted), dtype="float32") as llm:
            assert torch.equal(llm.prompt_logits(SEQ), want), fmt


UNPUBLISHED = {
    # `attention_bias` false (no q/k/v/o biases stored), tied embeddings, the default layer_types
    # (alternating from a sliding first)
    "unbiased-tied": dict(attention_bias=False, tie_word_embeddings=True, layer_types=None),
    # plain RoPE with a partial factor, which gpt-oss's rotary ignores (we rotated half of each head)
    "default-rope-partial": dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 0.5}),
}


@pytest.mark.parametrize("variant", sorted(UNPUBLISHED))
def test_configs_the_releases_do_not_use_match_transformers(variant: str, tmp_path: Path) -> None:
    path = save(gpt_oss(**UNPUBLISHED[variant]), tmp_path)
    assert_close_logits(ours(path), reference(path))
