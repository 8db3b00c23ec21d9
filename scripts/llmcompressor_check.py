"""compressed-tensors checkpoints written by llm-compressor itself, read by
compressed-tensors and by us.

The published W4A16 / W8A16 / FP8-dynamic / FP8-block / W8A8 MoE checkpoints (RedHatAI's
Qwen3 releases among them) are llm-compressor's output. transformers 5.24 cannot
decompress every one of them into its stacked experts (W4A16_ASYM, FP8_BLOCK and W8A8 fail
its weight conversion), so the reference is compressed-tensors' own decompression of each
linear, written as a dense fp32 twin. llm-compressor 0.14 wants transformers ≤ 5.17 and
compressed-tensors 0.19, so it runs in a side venv:

    python3 -m venv /tmp/lc && /tmp/lc/bin/pip install torch==2.13.0
    /tmp/lc/bin/pip install llmcompressor==0.14.0.1 transformers==5.17.0
    # 1. llm-compressor quantises tiny random models in each preset; the twins are written
    /tmp/lc/bin/python scripts/llmcompressor_check.py make /tmp/lcc
    # 2. we load each checkpoint; transformers runs each twin; logits must agree
    .venv/bin/python scripts/llmcompressor_check.py check /tmp/lcc

The twin's weights are compressed-tensors' decompression with the scales cast to fp32
first (exact products). Layouts no format of ours holds (fp8 per channel, int8 by group)
load dequantised with the experts quantised again at load: those are compared with
`--expert-dtype bf16`, where the load is exact.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from quant_tool_check import Tool, main, save_twin

# name → llm-compressor preset scheme, or ("GPTQ", preset, actorder) for its GPTQ modifier
VARIANTS = {
    "w4a16": "W4A16",
    "w4a16-asym": "W4A16_ASYM",
    "w8a16-group": "W8A16",
    "fp8-dynamic-rows": "FP8_DYNAMIC",
    "fp8-block": "FP8_BLOCK",
    "w8a8": "W8A8",
    "gptq-w4a16": ("GPTQ", "W4A16", "weight"),  # its default act-order: groups stay contiguous
    "mxfp4": "MXFP4A16",
    "nvfp4": "NVFP4A16",
}
REQUANTISED = ("w8a16-group", "fp8-dynamic-rows", "nvfp4")  # exact only under bf16


def _quantise(src: Path, out: Path, variant: str) -> None:
    import torch
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    ignore = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]  # routers stay float, as published
    spec = VARIANTS[variant]
    if isinstance(spec, tuple):
        from datasets import Dataset

        g = torch.Generator().manual_seed(1)
        data = Dataset.from_dict({"input_ids": torch.randint(0, 151936, (32, 64), generator=g).tolist()})
        recipe = GPTQModifier(targets="Linear", scheme=spec[1], ignore=ignore, actorder=spec[2])
        oneshot(model=model, recipe=recipe, tokenizer=tok, dataset=data, num_calibration_samples=32)
    else:
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=spec, ignore=ignore), tokenizer=tok)
    model.save_pretrained(out, save_compressed=True)
    tok.save_pretrained(out)


def _fp4_in_fp32() -> None:
    """compressed-tensors unpacks FP4 into bf16 by default and dequantises in that dtype,
    rounding code · scale / global; the twin wants the products exact."""
    import functools

    import compressed_tensors.compressors.nvfp4.base as nvfp4
    import torch

    if not isinstance(nvfp4.unpack_fp4_from_uint8, functools.partial):
        nvfp4.unpack_fp4_from_uint8 = functools.partial(nvfp4.unpack_fp4_from_uint8, dtype=torch.float32)


def _write_twin(src: Path, out: Path) -> int:
    """compressed-tensors' decompression of each quantised linear of `src`, as fp32."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file

    qc = json.loads((src / "config.json").read_text())["quantization_config"]
    (group,) = [g for g in qc["config_groups"].values() if g.get("weights")]
    fmt = group.get("format") or qc["format"]
    scheme = QuantizationScheme(targets=group["targets"], weights=QuantizationArgs(**group["weights"]), format=fmt)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    _fp4_in_fp32()
    tensors = {}
    for f in src.glob("*.safetensors"):
        tensors |= load_file(str(f))
    bases = sorted({k.rpartition(".")[0] for k in tensors if k.endswith(".weight_scale")})
    for base in bases:
        local = {k.rpartition(".")[2]: tensors.pop(k) for k in [k for k in tensors if k.rpartition(".")[0] == base]}
        if local["weight_scale"].is_floating_point():  # fp32 products: exact (MXFP4's are exponent bytes)
            local["weight_scale"] = local["weight_scale"].float()
        tensors[base + ".weight"] = compressor.decompress(local, scheme)["weight"].float()
    save_twin(src, out, tensors)
    return len(bases)


# experts 128 wide, hidden 256: the presets' groups of 128 divide both
TOOL = Tool("llm-compressor", 128, tuple(VARIANTS), _quantise, _write_twin, REQUANTISED, frozenset())


if __name__ == "__main__":
    sys.exit(main(TOOL, __doc__.split("\n")[0]))
