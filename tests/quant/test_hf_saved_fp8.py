"""FP8 checkpoints written by transformers' own `save_pretrained` after its FineGrainedFP8
quantisation: per-expert fp8 weights with one fused block-scale tensor per layer and
projection ("<P>.experts.gate_up_proj_scale_inv", "down_proj_scale_inv").

transformers cannot run that checkpoint on a machine without a GPU (its CPU path drops the
fused scales), so the reference is the checkpoint dequantised here, independently of our
loader: each expert's gate and up weights are stacked as the fused module held them, scaled
block by block with the fused scales, and split again; transformers runs that twin.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from quant_ckpt_support import assert_logits_match

from edgemoe import LLM
from edgemoe.quant.fused_experts import split_fused_scale
from edgemoe.quant.published import QuantConfigError
from edgemoe.quant.published_config import scheme_for

transformers = pytest.importorskip("transformers")
fp8_quantizer = pytest.importorskip("transformers.quantizers.quantizer_finegrained_fp8")

PROMPTS = [[9707, 11, 1879, 0], list(range(40000, 40061, 3))]
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", {"intermediate_size": 64, "moe_intermediate_size": 32, "num_experts": 8,
                                     "num_experts_per_tok": 2, "norm_topk_prob": True}),
    "olmoe": ("OlmoeConfig", {"intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2}),
    "mixtral": ("MixtralConfig", {"intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2}),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def hf_fp8_save(model_type: str, block: int | None, out: Path, tokenizer_from: Path) -> Path:
    """A tiny random model quantised by transformers' FineGrainedFP8 and saved by it."""
    cls, extra = MODELS[model_type]
    config = getattr(transformers, cls)(vocab_size=151936, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, **extra)
    torch.manual_seed(0)
    bf16 = out.parent / f"{out.name}-bf16"
    transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(bf16)
    mp = pytest.MonkeyPatch()
    # Its quantiser asks for a GPU (for its kernels), not for quantising: it quantises on the CPU.
    mp.setattr(fp8_quantizer.FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *a, **k: None)
    try:
        qc = transformers.FineGrainedFP8Config(weight_block_size=(block, block) if block else None)
        model = transformers.AutoModelForCausalLM.from_pretrained(bf16, quantization_config=qc, dtype=torch.bfloat16)
        model.save_pretrained(out, max_shard_size="300KB")  # shards: a linear's parts may sit in two files
    finally:
        mp.undo()
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, out / name)
    return out


def _expand(scale: torch.Tensor, rows: int, cols: int, block: int | None) -> torch.Tensor:
    """Block scales → one per weight; `block` None: one scale for the tensor."""
    rb, cb = (block, block) if block else (rows, cols)
    return scale.repeat_interleave(rb, 0)[:rows].repeat_interleave(cb, 1)[:, :cols]


def dequantised_twin(src: Path, out: Path, block: int | None) -> Path:
    """`src` with every fp8 weight dequantised to fp32 by the fused module's own blocking."""
    tensors: dict[str, torch.Tensor] = {}
    for f in src.glob("*.safetensors"):
        tensors |= load_file(f)
    dense = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype != torch.float8_e4m3fn:
            dense[name] = t.float()
        elif ".experts." not in name or "shared" in name:
            s = tensors[name.removesuffix("weight") + "weight_scale_inv"]
            dense[name] = t.float() * _expand(s, *t.shape, block)
    prefixes = {n.split(".experts.")[0] for n in tensors if ".experts." in n and "shared" not in n}
    for p in prefixes:
        gate_up, down = tensors[f"{p}.experts.gate_up_proj_scale_inv"], tensors[f"{p}.experts.down_proj_scale_inv"]
        names = ("w1", "w3", "w2") if f"{p}.experts.0.w1.weight" in tensors else ("gate_proj", "up_proj", "down_proj")
        for e in range(gate_up.shape[0]):
            g, u, d = (tensors[f"{p}.experts.{e}.{w}.weight"].float() for w in names)
            fused = torch.cat([g, u]) * _expand(gate_up[e], 2 * g.shape[0], g.shape[1], block)  # one scale: both
            dense[f"{p}.experts.{e}.{names[0]}.weight"], dense[f"{p}.experts.{e}.{names[1]}.weight"] = fused.split(g.shape[0])
            dense[f"{p}.experts.{e}.{names[2]}.weight"] = d * _expand(down[e], *d.shape, block)
    out.mkdir()
    save_file(dense, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config | {"torch_dtype": "float32", "dtype": "float32"}))
    return out


# Blocks that divide every matrix (transformers quantises all), and none (one scale a tensor).
@pytest.mark.parametrize("block", [16, 32, None])
@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_transformers_fp8_save_loads_and_matches_its_dequantised_twin(model_type: str, block: int | None, make_ckpt,
                                                                       tmp_path: Path) -> None:  # noqa: ANN001
    ckpt = hf_fp8_save(model_type, block, tmp_path / "fp8", make_ckpt("qwen3_moe"))
    names = {n: t for f in ckpt.glob("*.safetensors") for n, t in load_file(f).items()}
    assert len(list(ckpt.glob("*.safetensors"))) > 1
    assert any(n.endswith("layers.0.mlp.experts.gate_up_proj_scale_inv") or
               n.endswith("layers.0.block_sparse_moe.experts.gate_up_proj_scale_inv") for n in names), "not the layout"
    assert all(t.dtype == torch.float8_e4m3fn for n, t in names.items() if n.endswith("proj.weight") or ".w1." in n)
    twin = dequantised_twin(ckpt, tmp_path / "twin", block)
    ref = transformers.AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32, attn_implementation="eager")
    with LLM(str(ckpt), dtype="float32") as llm:
        b = block or 128  # a tensor's one scale in every 128-block: as lossless
        assert llm._engine().runtime.plan.expert_format == f"fp8 e4m3 ({b}x{b} blocks)"  # stayed fp8
        assert_logits_match(llm, ref, PROMPTS)


def stacked(src: Path, out: Path) -> Path:
    """`src` (per-expert fp8 weights, fused scales) with each layer's expert weights stacked
    as Qwen3.5's checkpoints store experts: "<P>.experts.gate_up_proj" [E, 2I, H] (gate rows
    first) and "<P>.experts.down_proj" [E, H, I]."""
    tensors: dict[str, torch.Tensor] = {}
    for f in src.glob("*.safetensors"):
        tensors |= load_file(f)
    prefixes = {n.split(".experts.")[0] for n in tensors if n.endswith("experts.gate_up_proj_scale_inv")}
    for p in prefixes:
        ids = range(tensors[f"{p}.experts.gate_up_proj_scale_inv"].shape[0])
        take = {w: [tensors.pop(f"{p}.experts.{e}.{w}.weight") for e in ids] for w in ("gate_proj", "up_proj", "down_proj")}
        tensors[f"{p}.experts.gate_up_proj"] = torch.stack([torch.cat(gu) for gu in zip(take["gate_proj"],
                                                                                       take["up_proj"], strict=True)])
        tensors[f"{p}.experts.down_proj"] = torch.stack(take["down_proj"])
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors*"))
    save_file(tensors, str(out / "model.safetensors"))
    return out


def test_stacked_fp8_experts_load_as_their_per_expert_twin(make_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    ckpt = hf_fp8_save("qwen3_moe", 32, tmp_path / "fp8", make_ckpt("qwen3_moe"))
    restacked = stacked(ckpt, tmp_path / "stacked")
    assert "model.layers.1.mlp.experts.gate_up_proj" in load_file(restacked / "model.safetensors")
    with LLM(str(ckpt), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    with LLM(str(restacked), dtype="float32") as llm:
        assert llm._engine().runtime.plan.expert_format == "fp8 e4m3 (32x32 blocks)"
        for prompt, w in zip(PROMPTS, want, strict=True):
            assert torch.equal(llm.prompt_logits(prompt), w)  # the same fp8 weights and scales


def test_fused_scales_split_by_half() -> None:
    inter, block = 64, 32  # gate: fused block rows 0-1, up: 2-3
    scale = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    parts = split_fused_scale("m", "gate_up_proj", scale, inter, block)
    assert torch.equal(parts["m.experts.1.gate_proj.weight"], scale[1, :2])
    assert torch.equal(parts["m.experts.1.up_proj.weight"], scale[1, 2:])
    one_row = split_fused_scale("m", "gate_up_proj", scale[:, :1], 16, 32)  # 2I <= B: both halves in row 0
    assert torch.equal(one_row["m.experts.0.up_proj.weight"], scale[0, :1])
    mixtral = split_fused_scale("m", "gate_up_proj", scale, inter, block, ("w1", "w3", "w2"))
    assert torch.equal(mixtral["m.experts.1.w3.weight"], scale[1, 2:])


def test_fused_scales_straddling_the_halves_are_refused() -> None:
    with pytest.raises(QuantConfigError, match="straddle"):
        split_fused_scale("m", "gate_up_proj", torch.ones(1, 3, 2), 48, 32)  # up rows 48..95: blocks 1 and 2


def test_a_float_weight_beside_scales_loads_as_stored() -> None:
    """transformers' FP8 save leaves a matrix its blocks don't divide in bf16, with
    uninitialised scales beside it: the weight is what the model holds."""
    scheme = scheme_for({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    w = torch.randn(64, 32, dtype=torch.bfloat16)
    assert scheme.decode({"weight": w, "weight_scale_inv": torch.full((1, 1), 7e25)}) is w


def test_a_tensor_scale_fills_every_block() -> None:
    scheme = scheme_for({"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                                 "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float",
                                                                                     "strategy": "tensor"}}}}})
    w = torch.randn(200, 300).to(torch.float8_e4m3fn)
    fmt, parts = scheme.decode({"weight": w, "weight_scale": torch.tensor([0.25])})
    assert torch.equal(fmt.dequantise(parts, 200, 300), w.float() * 0.25)


def test_ue8m0_scales_are_powers_of_two() -> None:
    """`scale_fmt: ue8m0` scales, as exponent bytes (uint8) or as float8_e8m0fnu: 2^(e - 127)."""
    scheme = scheme_for({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                                 "scale_fmt": "ue8m0"}})
    w = torch.randn(128, 256).to(torch.float8_e4m3fn)
    e = torch.tensor([[127, 124]], dtype=torch.uint8)
    for s in (e, e.view(torch.float8_e8m0fnu)):
        fmt, parts = scheme.decode({"weight": w, "weight_scale_inv": s})
        want = w.float() * torch.tensor([1.0, 0.125]).repeat_interleave(128)[None, :]
        assert torch.equal(fmt.dequantise(parts, 128, 256), want)


def test_a_model_transformers_left_unquantised_keeps_its_weights(make_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    """The default 128-blocks divide none of a tiny model's matrices: transformers writes
    every weight in bf16 with uninitialised scales beside it and an fp8 config. The
    experts stay unquantised and the model is its bf16 source."""
    ckpt = hf_fp8_save("qwen3_moe", 128, tmp_path / "fp8", make_ckpt("qwen3_moe"))
    names = {n: t for f in ckpt.glob("*.safetensors") for n, t in load_file(f).items()}
    assert not any(t.dtype == torch.float8_e4m3fn for t in names.values()), "not the layout under test"
    source = tmp_path / "fp8-bf16"
    for name in TOKENIZER_FILES:
        shutil.copy(ckpt / name, source / name)
    with LLM(str(source), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    with LLM(str(ckpt), dtype="float32") as llm:
        assert llm._engine().runtime.plan.expert_format == "unquantised (float32)"
        for prompt, w in zip(PROMPTS, want, strict=True):
            assert torch.equal(llm.prompt_logits(prompt), w)
