"""NVIDIA ModelOpt checkpoints written by ModelOpt itself, read by ModelOpt and by us.

NVIDIA publishes its FP8 and NVFP4 MoE releases (nvidia/Qwen3-30B-A3B-FP8, -NVFP4, …) as
ModelOpt's `export_hf_checkpoint` writes them: `quant_method: modelopt` and a `quant_algo`
(older exports only in hf_quant_config.json). ModelOpt 0.47 quantises and exports on a
CPU; it runs in llmcompressor_check.py's side venv:

    /tmp/lc/bin/pip install nvidia-modelopt==0.47.0
    /tmp/lc/bin/python scripts/modelopt_check.py make /tmp/moc
    .venv/bin/python scripts/modelopt_check.py check /tmp/moc

The twin holds each exported linear as ModelOpt's own quantised tensors dequantise it
(`FP8QTensor`, `NVFP4QTensor`, `MXFP4QTensor`), in fp32. Per-channel FP8's scale [N] is
given to it as a column [N, 1], block scales [N/B, 1, K/B, 1] as [N/B, K/B]; W8A16 (int8)
has no tensor class there: q · s a row. NVFP4 loads with its experts quantised again at load (into mxfp4), so it is
compared with `--expert-dtype bf16`, as is FP8 per channel (into int8 rows).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from quant_tool_check import Tool, main, save_twin

VARIANTS = {"fp8": "FP8_DEFAULT_CFG", "fp8-rows": "FP8_PER_CHANNEL_PER_TOKEN_CFG", "nvfp4": "NVFP4_DEFAULT_CFG",
            "fp8-blocks": "FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG", "mxfp4": "MXFP4_DEFAULT_CFG",
            "int8": "INT8_WEIGHT_ONLY_CFG"}


def _quantise(src: Path, out: Path, variant: str) -> None:
    import modelopt.torch.quantization as mtq
    import torch
    import transformers
    from modelopt.torch.export import export_hf_checkpoint

    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)

    def calibrate(m: torch.nn.Module) -> None:
        for _ in range(4):
            m(torch.randint(0, 151936, (1, 32), generator=g))

    mtq.quantize(model, getattr(mtq, VARIANTS[variant]), calibrate)
    export_hf_checkpoint(model, export_dir=str(out))
    for f in src.glob("tokenizer*"):
        shutil.copy(f, out / f.name)


def _write_twin(src: Path, out: Path) -> int:
    import torch
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
    from modelopt.torch.quantization.qtensor.mxfp4_tensor import MXFP4QTensor
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from safetensors.torch import load_file

    tensors = {}
    for f in src.glob("*.safetensors"):
        tensors |= load_file(str(f))
    bases = sorted(k.removesuffix(".weight_scale") for k in tensors if k.endswith(".weight_scale"))
    for b in bases:
        w, scale = tensors.pop(b + ".weight"), tensors.pop(b + ".weight_scale")
        tensors.pop(b + ".input_scale", None)
        shape = torch.Size([w.shape[0], w.shape[1] * 2])  # FP4: two codes a byte
        if w.dtype == torch.uint8 and scale.dtype == torch.uint8:  # MXFP4: E8M0 a 32
            dense = MXFP4QTensor(shape, torch.float32, w).dequantize(dtype=torch.float32, scale=scale,
                                                                     block_sizes={-1: 32})
        elif w.dtype == torch.uint8:  # NVFP4
            dense = NVFP4QTensor(shape, torch.float32, w).dequantize(
                dtype=torch.float32, scale=scale, double_scale=tensors.pop(b + ".weight_scale_2").float(),
                block_sizes={-1: 16})
        elif scale.dim() == 4:  # blocks: [N/B, 1, K/B, 1] as [N/B, K/B]
            blocks = {0: w.shape[0] // scale.shape[0], 1: w.shape[1] // scale.shape[2]}
            dense = FP8QTensor(w.shape, torch.float32, w).dequantize(dtype=torch.float32, scale=scale[:, 0, :, 0].float(),
                                                                     block_sizes=blocks)
        elif w.dtype == torch.int8:  # W8A16: a scale a row
            dense = w.float() * scale.float().reshape(-1, 1)
        else:
            col = scale.float().reshape(-1, 1) if scale.numel() > 1 else scale.float()
            dense = FP8QTensor(w.shape, torch.float32, w).dequantize(dtype=torch.float32, scale=col)
        tensors[b + ".weight"] = dense
    save_twin(src, out, tensors)
    return len(bases)


# experts 128 wide, hidden 256; NVFP4's blocks of 16 divide both
TOOL = Tool("modelopt", 128, tuple(VARIANTS), _quantise, _write_twin, ("nvfp4", "fp8-rows"))


if __name__ == "__main__":
    sys.exit(main(TOOL, __doc__.split("\n")[0]))
