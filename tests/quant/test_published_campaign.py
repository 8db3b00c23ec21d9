"""Published quantised checkpoints, adversarially: `quantization_config` spellings and
variants real releases use, each either loaded to the numbers the format defines or
refused at load naming config.json and the field. Each test marked "was:" failed before
its fix; the sweeps record variants checked and found right (oracles: plain
dequantise-to-fp32 loops over each format's published definition)."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from quant_ckpt_support import write_fp8
from safetensors.torch import load_file, save_file

from edgemoe import LLM
from edgemoe.assets.checkpoint import model_config
from edgemoe.cli import main
from edgemoe.models.checkpoint_files import CheckpointError
from edgemoe.models.quant_load import checkpoint_scheme
from edgemoe.quant import Fp8Block, Int4Group
from edgemoe.quant.published_config import scheme_for

SEQ = [5, 90, 17, 150, 3, 3, 200, 42]


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fp8(model_config("qwen3_moe", num_hidden_layers=1), tmp_path_factory.mktemp("fp8") / "ckpt")


def _with_config(src: Path, out: Path, edit) -> Path:  # noqa: ANN001
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_quantization_config_inside_text_config_is_read(tmp_path: Path) -> None:
    """was: a multimodal config holding its quantization_config in `text_config` loaded as
    unquantised: every fp8 weight cast without its scale (logits off by 4.4 on a scale of
    3.8), the scales only "unexpected" in a warning; int4's packed weights went missing."""
    transformers = pytest.importorskip("transformers")
    from hf_saved import save

    text = dict(vocab_size=512, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                max_position_embeddings=256, pad_token_id=None, layer_types=["linear_attention", "full_attention"],
                linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, num_hidden_layers=2,
                shared_expert_intermediate_size=16)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, out_hidden_size=32, patch_size=4,
                  num_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.Qwen3_5MoeForConditionalGeneration(
        transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision))
    src = save(model, tmp_path / "src")
    for fmt in ("fp8", "int4"):
        out = tmp_path / f"out-{fmt}"
        assert main(["convert", "--model", str(src), "--expert-dtype", fmt, "--out", str(out)]) == 0

        def inward(config: dict) -> None:
            config["text_config"]["quantization_config"] = config.pop("quantization_config")

        inner = _with_config(out, tmp_path / f"inner-{fmt}", inward)
        with LLM(str(src), dtype="float32", expert_dtype=fmt) as llm:
            want = llm.prompt_logits(SEQ)
        with LLM(str(inner), dtype="float32") as llm:
            assert llm._engine().runtime.plan.expert_format.startswith(fmt)
            assert torch.equal(llm.prompt_logits(SEQ), want)
    # converting such a checkpoint again leaves no stale quantization_config in text_config
    again = tmp_path / "again"
    assert main(["convert", "--model", str(tmp_path / "inner-fp8"), "--expert-dtype", "int8", "--out", str(again)]) == 0
    config = json.loads((again / "config.json").read_text())
    assert "quantization_config" not in config["text_config"]
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    # the top level's wins over text_config's
    both = {"quantization_config": {"quant_method": "fp8"}, "text_config": {"quantization_config": {"quant_method": "x"}}}
    assert checkpoint_scheme(both).format == Fp8Block(128)
    with pytest.raises(CheckpointError, match=r"config\.json \(text_config\): .*quant_method 'x'"):
        checkpoint_scheme({"text_config": {"quantization_config": {"quant_method": "x"}}})


@pytest.mark.parametrize("qc", [None, {}], ids=["absent", "empty"])
def test_quantised_tensors_without_their_quantization_config_are_refused(qc, fp8_ckpt: Path, tmp_path: Path,  # noqa: ANN001
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """was: an FP8 checkpoint whose config.json lost its quantization_config (or holds {})
    loaded, every e4m3 weight cast to the model dtype without its block scale, exit 0."""
    def edit(config: dict) -> None:
        config.pop("quantization_config")
        if qc is not None:
            config["quantization_config"] = qc

    ckpt = _with_config(fp8_ckpt, tmp_path / "ckpt", edit)
    assert main(["generate", "--model", str(ckpt), "--prompt", "hi", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "is stored as torch.float8_e4m3fn" in err and "quantization_config" in err and "Traceback" not in err


@pytest.mark.parametrize("store", ["mmap", "pageable"])
def test_fp8_experts_without_their_quantization_config_are_refused_from_any_store(
        store: str, fp8_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """was: with `--expert-store mmap` (served only unquantised), fp8 experts beside bf16
    attention were mapped as stored and cast to the model dtype without their scales, exit 0."""
    out = tmp_path / "ckpt"
    shutil.copytree(fp8_ckpt, out)
    weight_map = {}
    for f in sorted(out.glob("*.safetensors")):
        t = load_file(str(f))
        for n in [n for n in t if n.endswith("_scale_inv") and ".experts." not in n]:  # attention: bf16
            w = n.removesuffix("_scale_inv")
            t[w] = (t[w].float() * t.pop(n).float()).bfloat16()
        save_file(t, str(f), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(t, f.name)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    args = ["generate", "--model", str(out), "--prompt", "hi", "--max-tokens", "2", "--expert-store", store]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ".experts." in err and "is stored as torch.float8_e4m3fn" in err and "Traceback" not in err


REFUSED = [  # (quantization_config, what the message must say); was: a traceback, or a message naming no field
    ({"quant_method": "fp8", "weight_block_size": [0, 0]}, r"weight_block_size \[0, 0\]"),  # ZeroDivisionError
    ({"quant_method": "fp8", "weight_block_size": [-128, -128]}, r"weight_block_size \[-128, -128\]"),  # IndexError
    ({"quant_method": "fp8", "weight_block_size": 128}, r"weight_block_size 128"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128.5]}, r"weight_block_size block=128\.5"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, r"fmt='e5m2'"),
    ({"quant_method": "gptq", "bits": "four", "group_size": 128}, r"bits='four': expected an integer"),
    ({"quant_method": "gptq", "bits": 4, "group_size": None}, r"group_size=None: expected an integer"),
    ({"quant_method": "gptq", "bits": 4.7, "group_size": 128}, r"bits=4\.7"),  # was: read as 4
    ({"quant_method": "gptq", "bits": True, "group_size": 128}, r"bits=True"),  # was: "1 bits"
    ({"quant_method": "gptq", "bits": 4, "group_size": 32.5}, r"group_size=32\.5"),  # was: read as 32
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, r"group_size=0: expected -1"),  # was: one group a row
    ({"quant_method": "awq", "bits": 4, "group_size": -2}, r"group_size=-2"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 0}}}}, r"weights group_size=0"),  # crashed
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": None}}}}, r"weights group_size=None"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": None}}}}, r"block_structure None"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [0, 0]}}}}, r"block_structure \[0, 0\]"),
]


@pytest.mark.parametrize(("qc", "says"), REFUSED)
def test_bad_config_fields_are_refused_naming_config_json_and_the_field(qc: dict, says: str) -> None:
    with pytest.raises(CheckpointError, match=rf"config\.json: quantization_config .*{says}"):
        checkpoint_scheme({"quantization_config": qc})


def test_bad_block_size_exits_with_a_message_not_a_traceback(fp8_ckpt: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """was: ZeroDivisionError (block 0) / IndexError (negative) tracebacks from `generate`."""
    ckpt = _with_config(fp8_ckpt, tmp_path / "ckpt",
                        lambda c: c["quantization_config"].update(weight_block_size=[0, 0]))
    assert main(["generate", "--model", str(ckpt), "--prompt", "hi", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "config.json: quantization_config weight_block_size [0, 0]" in err and "Traceback" not in err


@pytest.mark.parametrize("qc", [
    {"quant_method": "gptq", "bits": "4", "group_size": "128"}, {"quant_method": "gptq", "bits": 4.0, "group_size": 128},
    {"quant_method": "fp8", "fmt": None, "weight_block_size": ["128", "128"]}, {"quant_method": "FP8", "fmt": "E4M3"},
])
def test_integer_valued_spellings_still_load(qc: dict) -> None:
    assert checkpoint_scheme({"quantization_config": qc}).format in (Int4Group(128), Fp8Block(128))


def test_int4_scales_rounded_to_fp16_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """was: one warning per linear (thousands a load) for fp32 scales."""
    scheme = scheme_for({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                                 "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int",
                                                                                     "strategy": "channel"}}}}})
    parts = {"weight_packed": torch.zeros(4, 1, dtype=torch.int32), "weight_shape": torch.tensor([4, 8])}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            scheme.decode(parts | {"weight_scale": torch.full((4, 1), 0.1, dtype=torch.float64)})
    assert sum("rounded to fp16" in r.message for r in caplog.records) <= 1


def _pack(v: torch.Tensor, dim: int, bits: int) -> torch.Tensor:
    """Unsigned `bits`-bit values → int32, 32/bits a word along `dim` (field i of word j: 32/bits·j + i)."""
    per = 32 // bits
    u = v.long().movedim(dim, -1)
    u = u.reshape(*u.shape[:-1], -1, per)
    w = sum(u[..., i] << (bits * i) for i in range(per))
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32).movedim(-1, dim).contiguous()


GPTQ = list(itertools.product((4, 8), (128, 32, -1), (False, True), (True, False), ("gptq", "gptq_v2")))


@pytest.mark.parametrize(("bits", "group", "desc_act", "sym", "layout"), GPTQ)
def test_gptq_variants_decode_to_their_definition(bits: int, group: int, desc_act: bool, sym: bool, layout: str) -> None:
    """Sweep: W[n, k] = s[g[k], n]·(q[k, n] − z[g[k], n]), the zero stored − 1 in "gptq"
    (v1), as is in "gptq_v2"; true_sequential / damp_percent only steer the quantiser."""
    g = torch.Generator().manual_seed(bits * 1000 + group)
    n, k, maxq = 48, 256, (1 << bits) - 1
    size = group if group > 0 else k
    q = torch.randint(0, maxq + 1, (k, n), generator=g)
    z = (torch.full((k // size, n), (maxq + 1) // 2) if sym
         else torch.randint(int(layout == "gptq"), maxq + 1, (k // size, n), generator=g))
    s = (torch.rand(k // size, n, generator=g) + 0.5).half()
    g_idx = (torch.randperm(k, generator=g) if desc_act else torch.arange(k)) // size
    want = (s.float()[g_idx] * (q - z[g_idx]).float()).T
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym,
          "checkpoint_format": layout, "true_sequential": True, "damp_percent": 0.01}
    stored_z = (z - int(layout == "gptq")) & maxq
    parts = {"qweight": _pack(q, 0, bits), "qzeros": _pack(stored_z, 1, bits), "scales": s,
             "g_idx": g_idx.to(torch.int32)}
    out = scheme_for({"quantization_config": qc}).decode(parts)
    got = out if isinstance(out, torch.Tensor) else out[0].dequantise(out[1], n, k)
    assert torch.equal(got.float(), want)


@pytest.mark.parametrize(("block", "shape", "scale_dtype"), list(itertools.product(
    (128, 64, 48), ((256, 384), (200, 136), (96, 40)), (torch.float32, torch.bfloat16))))
def test_fp8_blocks_decode_to_their_definition(block: int, shape: tuple[int, int], scale_dtype: torch.dtype) -> None:
    """Sweep: Qwen3 `*-FP8` config as published, blocks that do not divide the matrix, bf16 scales."""
    g = torch.Generator().manual_seed(block)
    n, k = shape
    q = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = (torch.rand(-(-n // block), -(-k // block), generator=g) + 0.1).to(scale_dtype)
    want = q.float() * s.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block],
          "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}
    fmt, parts = scheme_for({"quantization_config": qc}).decode({"weight": q, "weight_scale_inv": s})
    assert torch.equal(fmt.dequantise(parts, n, k), want)


def _per_tensor_fp8(config: dict, out: Path, autofp8: bool) -> Path:
    """`config`'s linears in fp8 with one scale a tensor: as AutoFP8 / vLLM save them
    (`weight_scale`, an `input_scale`, no `weight_block_size`) or as transformers does
    (`weight_scale_inv`, `weight_block_size: null`). The same numbers either way."""
    from quant_ckpt_support import _save, quantised_linear

    from edgemoe.assets.checkpoint import init_tensor, tensor_specs

    tensors = {}
    for name, shape in tensor_specs(config):
        w = init_tensor(name, shape, 0)
        if not quantised_linear(name):
            tensors[name] = w.to(torch.bfloat16)
            continue
        s = w.abs().max() / 448.0
        tensors[name] = (w / s).to(torch.float8_e4m3fn)
        tensors[name.replace(".weight", ".weight_scale" if autofp8 else ".weight_scale_inv")] = s.reshape(())
        if autofp8:
            tensors[name.replace(".weight", ".input_scale")] = torch.tensor(0.01)
    qc = ({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]} if autofp8 else
          {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None})
    return _save(out, tensors, config | {"quantization_config": qc})


def test_autofp8_per_tensor_checkpoints_load_as_their_scales_say(tmp_path: Path) -> None:
    # was: refused, "fp8 linear without its 'weight_scale_inv' tensor" (DeepSeek-Coder-V2-Lite-Instruct-FP8)
    config = model_config("qwen3_moe", num_hidden_layers=1)
    logits = []
    for autofp8 in (False, True):
        with LLM(str(_per_tensor_fp8(config, tmp_path / str(autofp8), autofp8)), dtype="float32") as llm:
            logits.append(llm.prompt_logits(SEQ))
    assert torch.equal(*logits)
