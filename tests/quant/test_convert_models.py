"""`edgemoe convert` on model families beyond the tiny Qwen3-MoE of test_load_time.py, each
model built by transformers' own class and saved by its `save_pretrained` (unit-scale
weights, so logits discriminate). Each case was once a defect:

- a tied LM head was missing from compressed-tensors' `ignore`: transformers quantised its
  `lm_head` Linear and failed to load the int8 / int4 output;
- a multimodal Qwen3.5's vision tower was dropped (the loader skips it), so transformers
  re-initialised it, and its linears were not in `ignore`;
- mxfp4 output of a hybrid whose shared expert is held as the bank's last expert put it
  into gpt-oss's routed tensors, and the output did not load back (now refused up front);
- Mixtral (w1/w3/w2) could not be written as mxfp4 at all, and was refused only after the load;
- an `--out` naming a file gave a raw NotADirectoryError.

Oracles: `edgemoe.LLM(out)` against `edgemoe.LLM(src, expert_dtype=fmt)` (the files are
lossless: equal logits), and transformers' load of the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_saved import save
from quant_ckpt_support import assert_logits_match
from safetensors.torch import load_file

from edgemoe import LLM
from edgemoe.cli import main

transformers = pytest.importorskip("transformers")

SEQ = [5, 90, 17, 150, 3, 3, 200, 42] + list(range(100, 160, 3))
SMALL = dict(vocab_size=512, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             max_position_embeddings=256, pad_token_id=None)
GDN = dict(layer_types=["linear_attention", "full_attention"], linear_num_key_heads=1, linear_num_value_heads=2,
           linear_key_head_dim=16, linear_value_head_dim=16)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def convert_cli(src: Path, fmt: str, out: Path) -> Path:
    assert main(["convert", "--model", str(src), "--expert-dtype", fmt, "--out", str(out)]) == 0
    return out


def logits(path: Path, **kw: str) -> torch.Tensor:
    with LLM(str(path), dtype="float32", **kw) as llm:
        return llm.prompt_logits(SEQ)


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return {n: t for f in sorted(path.glob("*.safetensors")) for n, t in load_file(f).items()}


def quant_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())["quantization_config"]


def test_tied_head_is_ignored_so_transformers_loads_int8(tmp_path: Path) -> None:
    config = transformers.Qwen3MoeConfig(**SMALL, **MOE, num_hidden_layers=2, intermediate_size=32,
                                         tie_word_embeddings=True)
    src = save(transformers.Qwen3MoeForCausalLM(config), tmp_path / "src")
    out = convert_cli(src, "int8", tmp_path / "out")
    assert "lm_head" in quant_config(out)["ignore"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    with LLM(str(out), dtype="float32") as llm:
        assert_logits_match(llm, ref, [SEQ])


def test_multimodal_vision_tower_is_copied_and_ignored(tmp_path: Path) -> None:
    text = dict(SMALL, **GDN, **MOE, num_hidden_layers=2, shared_expert_intermediate_size=16)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, out_hidden_size=32, patch_size=4,
                  num_position_embeddings=16)
    model = transformers.Qwen3_5MoeForConditionalGeneration(
        transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision))
    src = save(model, tmp_path / "src")
    out = convert_cli(src, "int8", tmp_path / "out")
    visual = {n: t for n, t in tensors(src).items() if n.startswith("model.visual.")}
    written = tensors(out)
    assert visual and all(torch.equal(written[n], t) for n, t in visual.items())
    ignore = quant_config(out)["ignore"]
    assert "model.visual.blocks.0.attn.qkv" in ignore and "model.visual.merger.linear_fc2" in ignore
    ref, info = transformers.AutoModelForImageTextToText.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(ref.state_dict()["model.visual.blocks.0.attn.qkv.weight"],
                       visual["model.visual.blocks.0.attn.qkv.weight"])
    with LLM(str(out), dtype="float32") as llm:
        assert_logits_match(llm, ref, [SEQ])


def test_mxfp4_hybrid_with_its_shared_expert_in_the_bank_is_refused_before_loading(tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # shared_expert_intermediate_size == moe_intermediate_size (every Qwen3-Next / Qwen3.5 release):
    # the shared expert is bank expert E, which gpt-oss's routed tensors have no place for.
    config = transformers.Qwen3_5MoeTextConfig(**SMALL, **GDN, **MOE, num_hidden_layers=2,
                                               shared_expert_intermediate_size=16)
    src = save(transformers.Qwen3_5MoeForCausalLM(config), tmp_path / "src")
    args = ["convert", "--model", str(src), "--expert-dtype", "mxfp4", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "shared expert" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # a shared expert of its own size is a dense linear: written unquantised, and loads back
    config = transformers.Qwen3_5MoeTextConfig(**SMALL, **GDN, **MOE, num_hidden_layers=2,
                                               shared_expert_intermediate_size=32)
    src = save(transformers.Qwen3_5MoeForCausalLM(config), tmp_path / "src2")
    out = convert_cli(src, "mxfp4", tmp_path / "out2")
    assert "model.layers.0.mlp.shared_expert.down_proj" in quant_config(out)["modules_to_not_convert"]
    assert torch.equal(logits(out), logits(src, expert_dtype="mxfp4"))


def test_mixtral_converts_to_mxfp4_in_transformers_5_names(tmp_path: Path) -> None:
    config = transformers.MixtralConfig(**SMALL, num_hidden_layers=2, intermediate_size=16, num_local_experts=4,
                                        num_experts_per_tok=2)
    src = save(transformers.MixtralForCausalLM(config), tmp_path / "src")
    out = convert_cli(src, "mxfp4", tmp_path / "out")
    names = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"])
    assert {"model.layers.1.mlp.experts.gate_up_proj_blocks", "model.layers.1.mlp.gate.weight"} <= names
    assert torch.equal(logits(out), logits(src, expert_dtype="mxfp4"))


def test_out_naming_a_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    assert main(["convert", "--model", str(tmp_path), "--expert-dtype", "int8", "--out", str(tmp_path / "f")]) != 0
    assert "not an empty directory" in capsys.readouterr().err
