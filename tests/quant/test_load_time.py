"""Load-time quantisation (`--expert-dtype`) and `edgemoe convert`.

Oracle for the quantised model: the same checkpoint with every expert matrix replaced by
dequantise(quantise(W)) in fp32 (the dequantise-first reference). `convert` output must
load back to the very same experts (the files are lossless), FP8 output must load in
transformers, int8/int4 output must load in transformers through compressed-tensors (its
MoE path decompresses "pack-quantized" experts), and MXFP4 blocks must dequantise through
transformers' gpt-oss dequantiser.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from quant_ckpt_support import assert_logits_match, hf_fp8_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tolerances import network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.cli import main
from edgemoe.convert import convert
from edgemoe.models.loader import load_checkpoint
from edgemoe.quant import Int4Group, expert_format, expert_nbytes

transformers = pytest.importorskip("transformers")

PROMPTS = [[9707, 11, 1879, 0], list(range(40000, 40061, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
FORMATS = ["fp8", "int8", "int4", "mxfp4"]


def is_expert(name: str) -> bool:
    return ".experts." in name


def dequantised_twin(src: Path, out: Path, fmt_name: str) -> Path:
    """`src` with every expert matrix W → dequantise(quantise(W)), all in fp32."""
    fmt = expert_format(fmt_name)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(f)
            save_file({n: (fmt.dequantise(fmt.quantise(t), *t.shape) if is_expert(n) else t.float())
                       for n, t in tensors.items()}, str(out / f.name))
        elif f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"torch_dtype": "float32"}))
    return out


@pytest.fixture(scope="module")
def bf16_ckpt(make_ckpt) -> Path:  # noqa: ANN001
    return make_ckpt("qwen3_moe", num_hidden_layers=2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_time_quantisation_matches_dequantised_twin(fmt: str, bf16_ckpt: Path, tmp_path: Path) -> None:
    twin = dequantised_twin(bf16_ckpt, tmp_path / "twin", fmt)
    with LLM(str(twin), dtype="float32") as llm:
        want_tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        want = [llm.prompt_logits(p) for p in PROMPTS]
    with LLM(str(bf16_ckpt), dtype="float32", expert_dtype=fmt) as llm:
        plan = llm._engine().runtime.plan
        assert plan.expert_format == expert_format(fmt).label
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want_tokens
        for prompt, ref in zip(PROMPTS, want, strict=True):
            # Identical fp32 weights; the expert paths may order their sums differently.
            torch.testing.assert_close(llm.prompt_logits(prompt), ref, rtol=0,
                                       atol=network_atol(torch.float32, 64, ref.abs().max().item()))


def same_experts(a, b) -> bool:  # noqa: ANN001
    return all(torch.equal(a.layer_parts(i)[n], b.layer_parts(i)[n]) for i in a.layers for n in a.layer_parts(i))


def same_dequantised(a, b) -> bool:  # noqa: ANN001
    """Every expert matrix of stores `a` and `b` dequantises to the same values."""
    hidden, inter = a.down_shape
    for i in a.layers:
        pa, pb = a.layer_parts(i), b.layer_parts(i)
        for which, shape in (("gate_up", (2 * inter, hidden)), ("down", (hidden, inter))):
            for e in range(a.num_experts):
                wa, wb = ({n[len(which):]: t[e] for n, t in p.items() if n.startswith(which)} for p in (pa, pb))
                halves = 2 if which == "gate_up" else 1
                if not torch.equal(a.format.dequantise(wa, *shape, halves), b.format.dequantise(wb, *shape, halves)):
                    return False
    return True


@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_round_trip_is_lossless(fmt: str, bf16_ckpt: Path, tmp_path: Path) -> None:
    out = convert(bf16_ckpt, fmt, tmp_path / "out", progress=False)
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    direct = load_checkpoint(bf16_ckpt, "float32", False, "ram", expert_dtype=fmt)
    again = load_checkpoint(out, "float32", False, "ram")  # auto: as the files store them
    assert direct.experts.format == expert_format(fmt)
    hidden, inter = direct.experts.down_shape
    if fmt == "int4" and max(hidden, inter) < 128:
        # One published group size must divide both matrices' K: the tiny model's 128-wide
        # groups (one partial group a row) are written as groups of gcd(128, H, I), the same values.
        assert again.experts.format == Int4Group(math.gcd(128, hidden, inter))
        assert same_dequantised(again.experts, direct.experts)
    else:
        assert again.experts.format == direct.experts.format
        assert same_experts(again.experts, direct.experts)
        assert again.experts.expert_nbytes == expert_nbytes(expert_format(fmt), hidden, inter)
    for name, t in direct.params.items():
        assert torch.equal(again.params[name], t), name


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_convert_int_output_loads_in_transformers_through_compressed_tensors(fmt: str, bf16_ckpt: Path,
                                                                            tmp_path: Path) -> None:
    pytest.importorskip("compressed_tensors")
    out = convert(bf16_ckpt, fmt, tmp_path / fmt, progress=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    ours = load_checkpoint(out, "float32", False, "ram")
    hidden, inter = ours.experts.down_shape
    for i, layer in enumerate(ref.model.layers):
        parts = ours.experts.layer_parts(i)
        for e in range(ours.experts.num_experts):
            for which, shape, theirs in (("gate_up", (2 * inter, hidden), layer.mlp.experts.gate_up_proj[e]),
                                         ("down", (hidden, inter), layer.mlp.experts.down_proj[e])):
                mine = ours.experts.format.dequantise({n[len(which):]: t[e] for n, t in parts.items()
                                                       if n.startswith(which)}, *shape, 2 if which == "gate_up" else 1)
                # compressed-tensors multiplies in the scales' dtype: fp16 for int4 (half an ulp)
                tol = mine.abs() * 2.0**-11 if fmt == "int4" else torch.zeros_like(mine)
                assert ((theirs.detach() - mine).abs() <= tol).all(), (i, e, which)
    if fmt == "int4":
        return  # logits: fp16-rounded experts move random routers' near ties; the weights are the check
    with LLM(str(out), dtype="float32") as llm:
        assert_logits_match(llm, ref, PROMPTS)


def test_convert_fp8_loads_in_transformers(bf16_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    assert main(["convert", "--model", str(bf16_ckpt), "--expert-dtype", "fp8", "--out", str(out)]) == 0
    ref = hf_fp8_model(out)
    with LLM(str(out), dtype="float32") as llm:
        assert_logits_match(llm, ref, PROMPTS)


def test_convert_mxfp4_blocks_match_transformers_dequantiser(bf16_ckpt: Path, tmp_path: Path) -> None:
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    out = convert(bf16_ckpt, "mxfp4", tmp_path / "mx", progress=False)
    loaded = load_checkpoint(bf16_ckpt, "float32", False, "ram", expert_dtype="mxfp4")
    fmt = loaded.experts.format
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.1.mlp.experts.down_proj"
    with safe_open(str(out / index[name + "_blocks"]), "pt") as f:
        blocks = f.get_tensor(name + "_blocks")
    with safe_open(str(out / index[name + "_scales"]), "pt") as f:
        scales = f.get_tensor(name + "_scales")
    theirs = mx.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)  # [E, H, I]
    hidden, inter = loaded.experts.down_shape
    parts = loaded.experts.layer_parts(1)
    for e in range(loaded.experts.num_experts):
        ours = fmt.dequantise({"": parts["down"][e], "_scale": parts["down_scale"][e]}, hidden, inter)
        assert torch.equal(theirs[e], ours)


def test_convert_refuses_a_non_empty_out(bf16_ckpt: Path, tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(FileExistsError):
        convert(bf16_ckpt, "int8", tmp_path / "x", progress=False)


def test_int4_published_groups_index_ours() -> None:
    """Each published group takes the scale of the group of ours it lies in: a row-wide
    group of ours (GPTQ's group_size -1) written in groups of 256 as well."""
    from edgemoe.quant.publish import encode_linear, shared_group

    n, k = 4, 768
    for fmt in (Int4Group(128), Int4Group(1 << 30)):
        groups = -(-k // fmt.group)  # parts made directly: quantising pads each row to its group
        parts = {"": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
                 "_scale": torch.rand(n, groups).half(), "_zero": torch.full((n, groups), 8, dtype=torch.uint8)}
        g = shared_group(fmt, (2048, k))
        out = encode_linear(fmt, "x.weight", parts, (n, k), g)
        assert out["x.weight_scale"].shape == (n, k // g)
        assert torch.equal(out["x.weight_scale"], parts["_scale"][:, torch.arange(k // g) * g // fmt.group])
