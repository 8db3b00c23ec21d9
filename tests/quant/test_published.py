"""Quantised checkpoints as published: decoders against independent packers, and whole
models against transformers (FP8) or the dense twin (AWQ, GPTQ: transformers needs
gptqmodel/optimum to load them, absent here, so the oracle is the same model with
W = (q - z)·s written in fp32, i.e. dequantise first)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch
from quant_ckpt_support import (
    AWQ_ORDER,
    _pack_cols,
    _pack_rows,
    _save,
    hf_fp8_model,
    write_fp8,
    write_fp8_rows,
    write_int4,
    write_requantised,
)
from safetensors.torch import load_file, save_file
from tolerances import network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.assets.checkpoint import model_config
from edgemoe.models.checkpoint_files import CheckpointError
from edgemoe.quant import Fp8Block, Int4Group, Int8Channel
from edgemoe.quant.mxfp4 import Mxfp4
from edgemoe.quant.published import QuantConfigError, unpack_int32
from edgemoe.quant.published_config import scheme_for

transformers = pytest.importorskip("transformers")

PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2023)), list(range(40000, 40061, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_unpack_int32_orders() -> None:
    g = torch.Generator().manual_seed(0)
    v = torch.randint(0, 16, (4, 16), generator=g)
    assert torch.equal(unpack_int32(_pack_cols(v, AWQ_ORDER), 1, tuple(AWQ_ORDER)), v.to(torch.uint8))
    assert torch.equal(unpack_int32(_pack_cols(v, list(range(8))), 1), v.to(torch.uint8))
    assert torch.equal(unpack_int32(_pack_rows(v.T.contiguous()), 0), v.T.to(torch.uint8))


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_int4_decoders_dequantise_to_the_packed_values(method: str) -> None:
    g = torch.Generator().manual_seed(1)
    K, N, G = 64, 24, 32
    # GPTQ v1 stores zero - 1 in 4 bits, so its zeros are 1..15 (0 would read back as 16).
    q, z = torch.randint(0, 16, (K, N), generator=g), torch.randint(int(method == "gptq"), 16, (K // G, N), generator=g)
    s = torch.rand(K // G, N, generator=g).half()
    want = ((q - z.repeat_interleave(G, 0)) * s.float().repeat_interleave(G, 0)).T
    qc = {"quant_method": method, "bits": 4, "group_size": G}
    scheme = scheme_for({"quantization_config": qc})
    if method == "awq":
        parts = {"qweight": _pack_cols(q, AWQ_ORDER), "qzeros": _pack_cols(z, AWQ_ORDER), "scales": s}
    else:
        parts = {"qweight": _pack_rows(q), "qzeros": _pack_cols(z - 1, list(range(8))), "scales": s,
                 "g_idx": (torch.arange(K) // G).to(torch.int32)}
    fmt, ours = scheme.decode(parts)
    assert fmt == Int4Group(G)
    assert torch.equal(fmt.dequantise(ours, N, K), want)


def test_gptq_act_order_decodes_by_its_g_idx() -> None:
    """An act-order linear (a permuted g_idx) decodes to its exact weights, each input
    scaled by its own group's scale and zero."""
    scheme = scheme_for({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32,
                                                 "desc_act": True}})
    g = torch.Generator().manual_seed(3)
    q, z = torch.randint(0, 16, (64, 8), generator=g), torch.randint(1, 15, (2, 8), generator=g)
    s = (torch.rand(2, 8, generator=g) + 0.5).half()
    g_idx = torch.randperm(64, generator=g) // 32
    parts = {"qweight": _pack_rows(q), "qzeros": _pack_cols(z - 1, list(range(8))), "scales": s,
             "g_idx": g_idx.to(torch.int32)}
    want = torch.stack([(q[k] - z[g_idx[k]]) * s[g_idx[k]].float() for k in range(64)]).T  # [N, K], a row at a time
    assert torch.equal(scheme.decode(parts), want)
    with pytest.raises(QuantConfigError, match="g_idx"):
        scheme.decode(parts | {"g_idx": (g_idx + 1).to(torch.int32)})  # a group past the scales


def test_unsupported_configs_are_named() -> None:
    with pytest.raises(QuantConfigError, match="bitsandbytes"):
        scheme_for({"quantization_config": {"quant_method": "bitsandbytes"}})
    with pytest.raises(QuantConfigError, match="3 bits"):
        scheme_for({"quantization_config": {"quant_method": "gptq", "bits": 3}})
    assert scheme_for({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}).format == Fp8Block(64)
    int8 = {"num_bits": 8, "type": "int", "strategy": "channel"}
    for where in ({"format": "naive-quantized"}, {"format": "mixed-precision", "g": {"format": "int-quantized"}}):
        group = {"weights": int8} | where.get("g", {})
        qc = {"quant_method": "compressed-tensors", "format": where["format"], "config_groups": {"g": group}}
        assert scheme_for({"quantization_config": qc}).format == Int8Channel()
    for other in ({"checkpoint_format": "marlin"}, {"is_marlin_format": True}):  # another packing: never misread
        with pytest.raises(QuantConfigError, match="gptq and gptq_v2"):
            scheme_for({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128} | other})


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    config = model_config("qwen3_moe", num_hidden_layers=2)
    return write_fp8(config, tmp_path_factory.mktemp("fp8") / "ckpt")


def test_fp8_checkpoint_matches_transformers(fp8_ckpt) -> None:  # noqa: ANN001
    ref = hf_fp8_model(fp8_ckpt)
    with LLM(str(fp8_ckpt), dtype="float32", max_prefill_tokens=4096) as llm:
        runtime = llm._engine().runtime
        assert runtime.plan.expert_format.startswith("fp8")  # experts stay fp8 in the store
        assert "fp8 checkpoint" in runtime.plan.dense_note
        ours_tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        for prompt in PROMPTS:
            ours = llm.prompt_logits(prompt)
            with torch.no_grad():
                theirs = ref(torch.tensor([prompt])).logits[0].float()
            # Both dequantise to the same fp32 weights; the forward passes order sums differently.
            atol = network_atol(torch.float32, 64, theirs.abs().max().item())
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, ours_tokens, strict=True):
            out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=24, min_new_tokens=24, do_sample=False, eos_token_id=None,
                               pad_token_id=151643)
            assert out[0, len(prompt):].tolist() == tokens


def test_compressed_tensors_act_order_decodes_by_its_g_idx() -> None:
    """compressed-tensors `actorder: group` (pack-quantized int4, a permuted weight_g_idx)."""
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "actorder": "group"}}}}
    scheme = scheme_for({"quantization_config": qc})
    g = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (8, 64), generator=g)  # [N, K], unsigned: q + 8
    s = torch.rand(8, 2, generator=g) + 0.5
    g_idx = torch.randperm(64, generator=g) // 32
    parts = {"weight_packed": _pack_cols(q, list(range(8))), "weight_scale": s, "weight_shape": torch.tensor([8, 64]),
             "weight_g_idx": g_idx.to(torch.int32)}
    want = torch.stack([(q[:, k] - 8) * s[:, g_idx[k]] for k in range(64)], dim=1)
    assert torch.equal(scheme.decode(parts), want)


@pytest.mark.parametrize("symmetric", [True, False])
def test_compressed_tensors_int8_by_group_decodes_exactly(symmetric: bool) -> None:
    """llm-compressor's W8A16 preset: pack-quantized int8 by groups of 128 (our int8 has a
    scale a row: the linear decodes to W = s[g] · (q − z[g]), its experts quantised at load)."""
    weights = {"num_bits": 8, "type": "int", "strategy": "group", "group_size": 32, "symmetric": symmetric}
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"weights": weights}}}
    scheme = scheme_for({"quantization_config": qc})
    assert scheme.format == Int8Channel()
    g = torch.Generator().manual_seed(5)
    q = torch.randint(-128, 128, (8, 64), generator=g)
    s = torch.rand(8, 2, generator=g) + 0.5
    z = torch.randint(-20, 20, (8, 2), generator=g) if not symmetric else torch.zeros(8, 2, dtype=torch.int64)

    def pack_bytes(v: torch.Tensor, dim: int) -> torch.Tensor:  # four v + 128 a word along `dim`, low byte first
        u = (v + 128).long().movedim(dim, -1)
        u = u.reshape(*u.shape[:-1], -1, 4)
        words = sum(u[..., i] << (8 * i) for i in range(4))
        return words.to(torch.int32).movedim(-1, dim)  # int64 → int32 wraps bit 31, as the packers' int32 does

    parts = {"weight_packed": pack_bytes(q, 1), "weight_scale": s, "weight_shape": torch.tensor([8, 64])}
    if not symmetric:
        parts["weight_zero_point"] = pack_bytes(z, 0)
    want = torch.stack([s[:, k // 32] * (q[:, k] - z[:, k // 32]) for k in range(64)], dim=1)
    assert torch.equal(scheme.decode(parts), want)


def _pack8(v: torch.Tensor, dim: int) -> torch.Tensor:
    """Values 0..255 → int32, four a word along `dim` (byte i of word j: position 4j + i)."""
    u = v.long().movedim(dim, -1)
    u = u.reshape(*u.shape[:-1], -1, 4)
    return sum(u[..., i] << (8 * i) for i in range(4)).to(torch.int32).movedim(-1, dim)


@pytest.mark.parametrize("config_bits", [8, 4])
def test_gptq_8bit_linears_decode_by_their_own_width(config_bits: int) -> None:
    """An 8-bit GPTQ linear (qweight [K/4, N]) dequantises exactly, whether the config says 8
    (its experts then go to int8 per channel) or 4 (a per-layer recipe, AutoRound's
    `extra_config`: the width is read off the linear's shapes)."""
    K, N, G = 64, 8, 32
    g = torch.Generator().manual_seed(6)
    q, z = torch.randint(0, 256, (K, N), generator=g), torch.randint(1, 256, (K // G, N), generator=g)
    s = (torch.rand(K // G, N, generator=g) + 0.5).half()
    scheme = scheme_for({"quantization_config": {"quant_method": "gptq", "bits": config_bits, "group_size": G}})
    assert scheme.format == (Int8Channel() if config_bits == 8 else Int4Group(G))
    parts = {"qweight": _pack8(q, 0), "qzeros": _pack8(z - 1, 1), "scales": s}
    want = torch.stack([(q[k] - z[k // G]) * s[k // G].float() for k in range(K)]).T
    assert torch.equal(scheme.decode(parts), want)
    with pytest.raises(QuantConfigError, match="neither 4 nor 8"):
        scheme.decode(parts | {"qweight": parts["qweight"][:3]})  # 12 or 24 inputs, not 33..64


def test_a_bad_quantised_linear_is_named_with_its_file(tmp_path_factory) -> None:  # noqa: ANN001
    root = tmp_path_factory.mktemp("bad-gptq")
    ckpt, _ = write_int4(model_config("qwen3_moe", num_hidden_layers=2), root / "q", root / "dense", "gptq")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.1.mlp.experts.3.up_proj.qweight"
    shard = ckpt / index[name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name][:1].contiguous()  # 8 inputs' worth: neither width fits 64
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=rf"{shard.name}: model\.layers\.1\.mlp\.experts\.3\.up_proj: GPTQ"):
        LLM(str(ckpt), dtype="float32")


def test_auto_round_configs_name_their_layout() -> None:
    def scheme(**qc: object):  # noqa: ANN202
        return scheme_for({"quantization_config": {"quant_method": "auto-round", "bits": 4, "group_size": 128, **qc}})

    assert (type(scheme()).__name__, scheme().zero_offset) == ("GptqScheme", 1)  # the default: auto_gptq
    assert scheme(packing_format="auto_round:gptqmodel").zero_offset == 0
    assert scheme(packing_format="auto_round").zero_offset == 0
    assert type(scheme(packing_format="auto_round:auto_awq")).__name__ == "AwqScheme"
    for refused in ({"data_type": "nv_fp"}, {"packing_format": "auto_round:fp8"}, {"bits": 2}):
        with pytest.raises(QuantConfigError):
            scheme(**refused)


@pytest.mark.parametrize(("method", "packing"), [("gptq", "auto_round:auto_gptq"), ("awq", "auto_round:auto_awq")])
def test_auto_round_checkpoints_load_as_their_packing(method: str, packing: str, tmp_path_factory) -> None:  # noqa: ANN001
    """Intel's AutoRound writes GPTQ / AWQ layouts under its own `quant_method`: the same
    tensors under either config load the same model."""
    root = tmp_path_factory.mktemp(f"auto-round-{method}")
    ckpt, _ = write_int4(model_config("qwen3_moe", num_hidden_layers=2), root / "q", root / "dense", method)
    with LLM(str(ckpt), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    config = json.loads((ckpt / "config.json").read_text())
    qc = config["quantization_config"]
    config["quantization_config"] = {"quant_method": "auto-round", "packing_format": packing, "bits": 4,
                                     "group_size": qc["group_size"], "sym": False, "data_type": "int",
                                     "extra_config": {".*mlp\\.gate.*": {"bits": 16, "data_type": "float"}}}
    (ckpt / "config.json").write_text(json.dumps(config))
    with LLM(str(ckpt), dtype="float32") as llm:
        assert all(torch.equal(llm.prompt_logits(p), w) for p, w in zip(PROMPTS, want, strict=True))


def test_compressed_tensors_fp4_decodes() -> None:
    """mxfp4-pack-quantized is our Mxfp4 as stored (E2M1 pairs low nibble first, E8M0 a
    32); nvfp4-pack-quantized dequantises to code · (e4m3 scale a 16 / global scale)."""
    def scheme(fmt: str, group: int):  # noqa: ANN202
        w = {"num_bits": 4, "type": "float", "strategy": "group", "group_size": group}
        return scheme_for({"quantization_config": {"quant_method": "compressed-tensors", "format": fmt,
                                                   "config_groups": {"g": {"weights": w}}}})

    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 16, (8, 64), generator=g)
    packed = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)  # element 2j low
    e8m0 = torch.randint(120, 134, (8, 2), generator=g).to(torch.uint8)
    mx = scheme("mxfp4-pack-quantized", 32)
    fmt, parts = mx.decode({"weight_packed": packed, "weight_scale": e8m0})
    lut = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    value = torch.tensor(lut + [-v for v in lut])[codes]
    assert torch.equal(fmt.dequantise(parts, 8, 64), value * 2.0 ** (e8m0.float() - 127)[:, torch.arange(64) // 32])
    e4m3 = (torch.rand(8, 4, generator=g) * 400).to(torch.float8_e4m3fn)
    nv = scheme("nvfp4-pack-quantized", 16)
    got = nv.decode({"weight_packed": packed, "weight_scale": e4m3, "weight_global_scale": torch.tensor([5888.0])})
    assert torch.equal(got, value * (e4m3.float() / 5888.0)[:, torch.arange(64) // 16])


def test_modelopt_configs_and_nvfp4_scales() -> None:
    """NVIDIA ModelOpt: `quant_algo` names the layout; NVFP4's `weight_scale_2` multiplies
    (compressed-tensors' global scale divides)."""
    def scheme(algo: str):  # noqa: ANN202
        return scheme_for({"quantization_config": {"quant_method": "modelopt", "quant_algo": algo}})

    assert scheme("FP8").format == Fp8Block() and scheme("FP8_PER_CHANNEL_PER_TOKEN").format == Int8Channel()
    with pytest.raises(QuantConfigError, match="W4A8_AWQ"):
        scheme("W4A8_AWQ")
    g = torch.Generator().manual_seed(8)
    codes = torch.randint(0, 16, (8, 32), generator=g)
    packed = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)
    e4m3 = (torch.rand(8, 2, generator=g) * 400).to(torch.float8_e4m3fn)
    lut = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = torch.tensor(lut + [-v for v in lut])[codes] * (e4m3.float() * 0.25)[:, torch.arange(32) // 16]
    got = scheme("NVFP4").decode({"weight": packed, "weight_scale": e4m3, "weight_scale_2": torch.tensor(0.25),
                                  "input_scale": torch.tensor(1.0)})
    assert torch.equal(got, want)
    # lossless ones: 128-blocks with scales [N/128, 1, K/128, 1]; int8 with a scale [N] a row; MXFP4 as ours
    q8 = (torch.randn(256, 384, generator=g) * 50).to(torch.float8_e4m3fn)
    blocks = torch.rand(2, 1, 3, 1, generator=g) + 0.5
    fmt, parts = scheme("fp8_pb_wo").decode({"weight": q8, "weight_scale": blocks})
    want = q8.float() * blocks[:, 0, :, 0].repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(fmt.dequantise(parts, 256, 384), want)
    i8, rows = torch.randint(-127, 128, (8, 32), generator=g).to(torch.int8), torch.rand(8, generator=g)
    fmt, parts = scheme("W8A16").decode({"weight": i8, "weight_scale": rows, "input_scale": torch.tensor(1.0)})
    assert torch.equal(fmt.dequantise(parts, 8, 32), i8.float() * rows[:, None])
    e8m0 = torch.randint(120, 134, (8, 1), generator=g).to(torch.uint8)
    fmt, parts = scheme("mxfp4").decode({"weight": packed, "weight_scale": e8m0})
    assert fmt == Mxfp4() and torch.equal(parts[""], packed) and torch.equal(parts["_scale"], e8m0)


def test_modelopt_fp8_checkpoint_loads_from_either_config(tmp_path_factory, caplog) -> None:  # noqa: ANN001
    """ModelOpt FP8 (a scale a tensor, static input scales beside it) is lossless, whether
    config.json says it or, as older exports do, only hf_quant_config.json; the input scales
    are passed over quietly (compute is weight-only)."""
    root = tmp_path_factory.mktemp("modelopt")
    config = model_config("qwen3_moe", num_hidden_layers=2)
    _, dense = write_int4(config, root / "unused", root / "dense", "gptq")  # any dense fp32 model
    tensors = {}
    for f in sorted(dense.glob("*.safetensors")):
        tensors |= load_file(str(f))
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        w = tensors.pop(name)
        s = w.abs().max() / 448.0
        base = name.removesuffix(".weight")
        tensors |= {name: (w / s).to(torch.float8_e4m3fn), base + ".weight_scale": s.reshape(()),
                    base + ".input_scale": torch.tensor(0.5)}
        tensors[name.replace(".weight", ".twin")] = (w / s).to(torch.float8_e4m3fn).float() * s
    twin = {n.replace(".twin", ".weight"): t for n, t in tensors.items() if n.endswith(".twin")}
    quantised = {n: t for n, t in tensors.items() if not n.endswith(".twin")}
    qc = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}
    ckpt = _save(root / "fp8", quantised, config | {"quantization_config": qc})
    old = _save(root / "fp8-old", quantised, config)
    (old / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    want_dir = _save(root / "twin", {n: twin.get(n, t) for n, t in quantised.items() if ".weight_scale" not in n
                                     and ".input_scale" not in n}, config | {"torch_dtype": "float32"})
    with LLM(str(want_dir), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    for path in (ckpt, old):
        with LLM(str(path), dtype="float32") as llm:
            assert llm._engine().runtime.plan.expert_format == Fp8Block().label
            for prompt, ref in zip(PROMPTS, want, strict=True):
                atol = network_atol(torch.float32, 64, ref.abs().max().item())
                torch.testing.assert_close(llm.prompt_logits(prompt), ref, atol=atol, rtol=0)
    assert "unexpected tensor" not in caplog.text


@pytest.mark.parametrize("qc", [
    # llm-compressor's KV-cache-only recipe (as 0.14 writes it), and ModelOpt's KV-only export
    {"quant_method": "compressed-tensors", "config_groups": {}, "format": "dense",
     "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}},
    {"quant_method": "modelopt", "quant_algo": None, "kv_cache_quant_algo": "FP8"},
], ids=["compressed-tensors", "modelopt"])
def test_kv_cache_only_configs_load_the_weights_as_stored(qc, make_ckpt, tmp_path, caplog) -> None:  # noqa: ANN001
    """A quantization_config that quantises only the KV cache: the weights load as they
    are, and its `self_attn.k_scale` / `v_scale` are passed over quietly."""
    src = make_ckpt("qwen3_moe", torch_dtype="float32")
    with LLM(str(src), dtype="float32") as llm:
        want = llm.prompt_logits(PROMPTS[1])
    ckpt = tmp_path / "kv"
    shutil.copytree(src, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor(0.5), "model.layers.0.self_attn.v_scale": torch.tensor(0.5)},
              str(ckpt / "kv-scales.safetensors"))
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] |= {"model.layers.0.self_attn.k_scale": "kv-scales.safetensors",
                               "model.layers.0.self_attn.v_scale": "kv-scales.safetensors"}
        index.write_text(json.dumps(data))
    with LLM(str(ckpt), dtype="float32") as llm:
        assert llm._engine().runtime.plan.expert_format == "unquantised (float32)"
        assert torch.equal(llm.prompt_logits(PROMPTS[1]), want)
    assert "unexpected tensor" not in caplog.text


def test_gptq_act_order_checkpoint_loads(tmp_path_factory) -> None:  # noqa: ANN001
    """Act-order GPTQ: exact under `--expert-dtype bf16`; under auto the experts are the
    exact weights quantised into our int4 groups at load, as `Int4Group.quantise` does
    them (the reference: the twin's experts through quantise + dequantise)."""
    config = model_config("qwen3_moe", num_hidden_layers=2)
    root = tmp_path_factory.mktemp("act-order")
    # group 16: every expert matrix (down's K is 32) has groups to permute
    ckpt, dense = write_int4(config, root / "q", root / "dense", "gptq", group=16, act_order=True)
    with LLM(str(dense), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    with LLM(str(ckpt), dtype="float32", expert_dtype="bf16") as llm:
        for prompt, ref in zip(PROMPTS, want, strict=True):
            atol = network_atol(torch.float32, 64, ref.abs().max().item())
            torch.testing.assert_close(llm.prompt_logits(prompt), ref, atol=atol, rtol=0)
    requantised = write_requantised(dense, root / "requantised", Int4Group(16))
    with LLM(str(requantised), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    with LLM(str(ckpt), dtype="float32", moe_backend="cpu") as llm:
        engine = llm._engine()
        assert engine.runtime.plan.expert_format == "int4 (group 16)"
        for prompt, ref in zip(PROMPTS, want, strict=True):
            atol = network_atol(torch.float32, 64, ref.abs().max().item())
            torch.testing.assert_close(llm.prompt_logits(prompt), ref, atol=atol, rtol=0)


@pytest.mark.parametrize(("method", "backend"), [("awq", "resident"), ("gptq", "cpu")])
def test_int4_checkpoint_matches_its_dense_twin(method: str, backend: str, tmp_path_factory) -> None:  # noqa: ANN001
    config = model_config("qwen3_moe", num_hidden_layers=2)
    root = tmp_path_factory.mktemp(method)
    ckpt, dense = write_int4(config, root / "q", root / "dense", method)
    with LLM(str(dense), dtype="float32") as llm:
        want_tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        want_logits = [llm.prompt_logits(p) for p in PROMPTS]
    slots = {} if backend == "resident" else {"moe_slots": 4}  # resident has no slots (refused)
    with LLM(str(ckpt), dtype="float32", moe_backend=backend, **slots) as llm:
        assert llm._engine().runtime.plan.expert_format.startswith("int4")
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want_tokens
        for prompt, want in zip(PROMPTS, want_logits, strict=True):
            # Identical fp32 weights (q, z and fp16 s are exact in fp32); sums may be ordered differently.
            atol = network_atol(torch.float32, 64, want.abs().max().item())
            torch.testing.assert_close(llm.prompt_logits(prompt), want, atol=atol, rtol=0)
    assert len(set(want_tokens[0])) > 4, "degenerate reference output: weak test"


def test_fp8_row_scaled_checkpoint_loads_with_its_experts_in_int8_rows(tmp_path_factory, caplog) -> None:  # noqa: ANN001
    """compressed-tensors FP8 with per-channel scales (FP8_DYNAMIC): the layout checked by
    transformers (weight-only, so it doesn't quantise activations), then our load: dense
    layers as W = q·s, experts quantised at load into int8 per channel (a byte a weight
    and a scale a row, as stored) — the dequantise-first reference of that format. Static
    activation scales beside the weights are passed over quietly (compute is weight-only)."""
    config = model_config("qwen3_moe", num_hidden_layers=2)
    root = tmp_path_factory.mktemp("fp8rows")
    weight_only, dense = write_fp8_rows(config, root / "w8a16", root / "dense", dynamic_activations=False)
    if importlib.util.find_spec("compressed_tensors") is not None:
        theirs = transformers.AutoModelForCausalLM.from_pretrained(weight_only, dtype=torch.float32).eval()
        twin = transformers.AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
        with torch.no_grad():
            assert torch.equal(theirs(torch.tensor([PROMPTS[0]])).logits, twin(torch.tensor([PROMPTS[0]])).logits)
    ckpt, _ = write_fp8_rows(config, root / "dynamic", root / "dense2", static_scales=True)
    fmt = Int8Channel()
    with LLM(str(write_requantised(dense, root / "int8-rows", fmt)), dtype="float32") as llm:
        want = [llm.prompt_logits(p) for p in PROMPTS]
    with LLM(str(ckpt), dtype="float32") as llm:
        plan = llm._engine().runtime.plan
        assert plan.expert_format == fmt.label and "quantised at load" in plan.dense_note
        for prompt, w in zip(PROMPTS, want, strict=True):
            atol = network_atol(torch.float32, 64, w.abs().max().item())
            torch.testing.assert_close(llm.prompt_logits(prompt), w, atol=atol, rtol=0)
    assert "unexpected tensor" not in caplog.text


def test_compressed_tensors_int4_per_channel_is_one_group_a_row() -> None:
    from edgemoe.quant.publish import pack_int32

    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}}
    scheme = scheme_for({"quantization_config": qc})
    g = torch.Generator().manual_seed(3)
    n, k = 6, 200
    q = torch.randint(0, 16, (n, k), generator=g)
    s = torch.rand(n, 1, generator=g).half()
    fmt, parts = scheme.decode({"weight_packed": pack_int32(q, 1), "weight_scale": s, "weight_shape": torch.tensor([n, k])})
    assert torch.equal(fmt.dequantise(parts, n, k), (q - 8).float() * s.float())
