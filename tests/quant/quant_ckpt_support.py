"""Tiny quantised checkpoints in the layouts as published, written independently of the
loader's decoders (plain loops over the documented bit layouts), for the loading tests.

- `write_fp8`: Qwen3 `*-FP8`: every `*_proj.weight` as e4m3 + `weight_scale_inv`
  [ceil(N/128), ceil(K/128)]; router, norms, embeddings, LM head stay bf16.
- `write_int4(method="awq"|"gptq")`: random integer weights q, zero points z and fp16 group
  scales s for every `*_proj` linear, packed as AutoAWQ (GEMM) / GPTQ store them, plus
  the dense twin: the same model with W = (q - z)·s in fp32 — the dequantise-first
  reference the quantised load must equal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgemoe.assets.checkpoint import init_tensor, tensor_specs
from edgemoe.assets.model_files import write_model_files
from edgemoe.quant import ExpertFormat

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of an int32 holds column 8j + AWQ_ORDER[i]


def quantised_linear(name: str) -> bool:
    return name.endswith("_proj.weight")  # q/k/v/o, gate/up/down of experts and dense MLPs


def _save(out: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    # Two shards, split mid-model: a linear's parts may be read from either file.
    names = list(tensors)
    half = len(names) // 2
    weight_map = {}
    for k, chunk in enumerate((names[:half], names[half:]), start=1):
        fname = f"model-{k:05d}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in chunk}, str(out / fname), metadata={"format": "pt"})
        weight_map |= {n: fname for n in chunk}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_model_files(out, config)
    return out


def write_fp8(config: dict[str, Any], out: Path, seed: int = 0, block: int = 128) -> Path:
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in tensor_specs(config):
        w = init_tensor(name, shape, seed)
        if not quantised_linear(name):
            tensors[name] = w.to(torch.bfloat16)
            continue
        n, k = shape
        q = torch.empty(shape, dtype=torch.float8_e4m3fn)
        s = torch.empty(math.ceil(n / block), math.ceil(k / block))
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
                s[i, j] = tile.abs().max() / 448.0
                q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / s[i, j]).to(torch.float8_e4m3fn)
        tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q, s
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block]}
    return _save(out, tensors, config | {"quantization_config": qc})


def _pack_cols(v: torch.Tensor, order: list[int]) -> torch.Tensor:
    """[R, C] values 0..15 → int32 [R, C/8]: nibble i of column j holds v[:, 8j + order[i]]."""
    out = torch.zeros(v.shape[0], v.shape[1] // 8, dtype=torch.int64)
    for j in range(out.shape[1]):
        for i in range(8):
            out[:, j] |= (v[:, 8 * j + order[i]].long() & 0xF) << (4 * i)
    return out.to(torch.int32)  # NOTE: int64 → int32 wraps bit 31 into the sign, as the packers' int32 does


def _pack_rows(v: torch.Tensor) -> torch.Tensor:
    """[R, C] → int32 [R/8, C]: nibble i of row j holds v[8j + i]."""
    return _pack_cols(v.T.contiguous(), list(range(8))).T.contiguous()


def write_int4(config: dict[str, Any], out: Path, dense_out: Path, method: str, seed: int = 0,
               group: int = 32, act_order: bool = False) -> tuple[Path, Path]:
    """The `method` ("awq" / "gptq") checkpoint and its dense fp32 twin; `act_order` (GPTQ):
    each input's group from a random permutation (`desc_act`), as g_idx says."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, shape in tensor_specs(config):
        if not quantised_linear(name):
            dense[name] = tensors[name] = init_tensor(name, shape, seed)
            continue
        n, k = shape
        q = torch.randint(0, 16, (k, n), generator=g)  # W^T, as both formats store it
        z = torch.randint(5, 11, (k // group, n), generator=g)
        s = (torch.rand(k // group, n, generator=g) + 0.5) / (4.6 * math.sqrt(k))  # W ~ 1/sqrt(K)
        s = s.to(torch.float16)
        g_of_k = torch.randperm(k, generator=g) // group if act_order else torch.arange(k) // group
        dense[name] = ((q - z[g_of_k]) * s.float()[g_of_k]).T.contiguous()
        base = name.removesuffix(".weight")
        if method == "awq":
            tensors[base + ".qweight"] = _pack_cols(q, AWQ_ORDER)
            tensors[base + ".qzeros"] = _pack_cols(z, AWQ_ORDER)
        else:
            tensors[base + ".qweight"] = _pack_rows(q)
            tensors[base + ".qzeros"] = _pack_cols(z - 1, list(range(8)))  # GPTQ v1 stores zero - 1
            tensors[base + ".g_idx"] = g_of_k.to(torch.int32)
        tensors[base + ".scales"] = s
    qc = ({"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
          if method == "awq" else
          {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": False,
           "checkpoint_format": "gptq"})
    fp16 = {n: (t.to(torch.float16) if t.is_floating_point() and t.dtype == torch.float32 else t)
            for n, t in tensors.items()}  # published 4-bit models are fp16
    _save(out, fp16, config | {"quantization_config": qc, "torch_dtype": "float16"})
    # The twin's unquantised tensors are the fp16-rounded ones the quantised checkpoint holds.
    _save(dense_out, {n: (fp16[n].float() if n in fp16 else t) for n, t in dense.items()},
          config | {"torch_dtype": "float32"})
    return out, dense_out


def write_requantised(dense: Path, out: Path, fmt: ExpertFormat) -> Path:
    """`dense` with every expert matrix W replaced by `fmt`'s rounding of it,
    dequantise(quantise(W)): what quantising those experts at load must give."""
    config = json.loads((dense / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(dense.glob("*.safetensors")):
        tensors |= load_file(str(f))
    for name, w in tensors.items():
        if ".experts." in name and quantised_linear(name):
            tensors[name] = fmt.dequantise(fmt.quantise(w.float()), *w.shape)
    return _save(out, tensors, config)


def hf_fp8_model(path):  # noqa: ANN001, ANN201
    transformers = pytest.importorskip("transformers")
    import transformers.quantizers.quantizer_finegrained_fp8 as fp8_quantizer

    # transformers dequantises FP8 checkpoints on a machine without a GPU; its environment
    # check asks for accelerate first, which that path does not use (absent in the test venv).
    mp = pytest.MonkeyPatch()
    mp.setattr(fp8_quantizer, "is_accelerate_available", lambda: True)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    finally:
        mp.undo()
    return model.eval()


def write_fp8_rows(config: dict[str, Any], out: Path, dense_out: Path, seed: int = 0,
                   dynamic_activations: bool = True, static_scales: bool = False) -> tuple[Path, Path]:
    """compressed-tensors FP8_DYNAMIC as llm-compressor writes it: every `*_proj.weight` as
    e4m3 with one fp32 scale per output row (`weight_scale` [N, 1]), and the dense twin
    (W = q·s in fp32). Without `dynamic_activations`: weight-only (FP8 W8A16), which
    transformers runs without quantising its activations. `static_scales`: each linear
    also carries a static activation scale (`input_scale`, as the FP8 static recipe)."""
    tensors: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, shape in tensor_specs(config):
        w = init_tensor(name, shape, seed).float()
        if not quantised_linear(name):
            dense[name] = tensors[name] = w.to(torch.bfloat16)
            continue
        s = w.abs().amax(dim=1, keepdim=True) / 448.0
        q = (w / s).to(torch.float8_e4m3fn)
        tensors[name], tensors[name.replace(".weight", ".weight_scale")] = q, s
        if static_scales:
            tensors[name.replace(".weight", ".input_scale")] = torch.tensor([0.25])
        dense[name] = q.float() * s
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "group_size": None,
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax"}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True,
            "group_size": None, "actorder": None, "block_structure": None, "observer": None}
    ignore = [n.removesuffix(".weight") for n, _ in tensor_specs(config)
              if n.endswith(".weight") and not quantised_linear(n) and "gate.weight" in n] + ["lm_head"]
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                        "input_activations": acts if dynamic_activations else None,
                                        "output_activations": None}},
          "ignore": ignore, "kv_cache_scheme": None}
    _save(out, tensors, config | {"quantization_config": qc})
    _save(dense_out, {n: t.float() for n, t in dense.items()}, config | {"torch_dtype": "float32"})
    return out, dense_out


def assert_logits_match(llm, ref, prompts: list[list[int]]) -> None:  # noqa: ANN001
    """Our fp32 prompt logits against a transformers model's, within the network tolerance."""
    from tolerances import network_atol

    for prompt in prompts:
        ours = llm.prompt_logits(prompt)
        with torch.no_grad():
            theirs = ref.eval()(torch.tensor([prompt])).logits[0].float()
        torch.testing.assert_close(ours, theirs, rtol=0, atol=network_atol(torch.float32, 64, theirs.abs().max().item()))
