"""GPTQ and AWQ checkpoints written by gptqmodel itself, read by gptqmodel and by us.

transformers 5.x cannot load a GPTQ / AWQ MoE's experts (its fused expert modules take
no quantised linears; the experts come back UNEXPECTED / MISSING), so the independent
reader of these formats is gptqmodel, which un-fuses the experts first. It does not run
in the test venv (it pulls a CUDA build of torch), so this check has two halves in two
environments:

    # a side venv, once (~6 GB: gptqmodel asks for torch 2.14's CUDA build; runs on a CPU)
    python3 -m venv /tmp/gq && /tmp/gq/bin/pip install torch==2.13.0 transformers==5.24.0 optimum
    BUILD_CUDA_EXT=0 /tmp/gq/bin/pip install --no-build-isolation gptqmodel==7.7.0
    # 1. gptqmodel quantises tiny random models (GPTQ sym/asym, v1/v2, act-order; AWQ GEMM)
    #    and writes, beside each checkpoint, the dense fp32 twin of its own dequantisation
    GPTQMODEL_CPU_WORKERS=2 CUDA_VISIBLE_DEVICES= /tmp/gq/bin/python scripts/gptqmodel_check.py make /tmp/gqc
    # 2. we load each checkpoint; transformers runs each twin; logits must agree
    .venv/bin/python scripts/gptqmodel_check.py check /tmp/gqc

The twin holds W = s[g] · (q − z[g]) computed by gptqmodel's own unpacking (its scales
cast to fp32 first, so the products are exact): ours must equal it up to the order of
fp32 sums. Act-order (a permuted g_idx) is compared with its experts unquantised
(`--expert-dtype bf16`): under auto they are quantised again at load, into our contiguous groups.
"""

from __future__ import annotations

import sys
from pathlib import Path

from quant_tool_check import Tool, main, save_twin

# name → (bits, sym, desc_act, format, method)
VARIANTS = {
    "gptq4-sym": (4, True, False, "gptq", "gptq"),
    "gptq4-asym": (4, False, False, "gptq", "gptq"),
    "gptq4-sym-v2": (4, True, False, "gptq_v2", "gptq"),
    "gptq4-act-order": (4, True, True, "gptq", "gptq"),
    "awq4-gemm": (4, False, False, "gemm", "awq"),
}
# gptqmodel 7.7's own failures, not ours: its AWQ scale search on OLMoE divides the q/k norm
# (over all heads) by a hidden-sized scale, and its worker threads take the process down
BROKEN_IN_GPTQMODEL = {("olmoe", "awq4-gemm")}


def _quantise(src: Path, out: Path, variant: str) -> None:
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig

    bits, sym, desc, fmt, method = VARIANTS[variant]
    qc = QuantizeConfig(bits=bits, group_size=32, sym=sym, desc_act=desc, format=fmt, method=method)
    model = GPTQModel.load(str(src), qc, device="cpu")
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 151936, (1, 64), generator=g),
              "attention_mask": torch.ones(1, 64, dtype=torch.long)} for _ in range(32)]
    model.quantize(calib, batch_size=1)
    model.save(str(out))


def _write_twin(src: Path, out: Path) -> int:
    """gptqmodel's reading of `src`, every quantised linear dequantised exactly, as fp32."""
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file

    model = GPTQModel.load(str(src), device="cpu", dtype=torch.float16,
                           backend=BACKEND.TORCH if "gptq" in src.name else BACKEND.AUTO)
    tensors = {}
    for f in src.glob("*.safetensors"):
        tensors |= {k: v.float() for k, v in load_file(str(f)).items()}
    count = 0
    for name, mod in model.model.named_modules():
        if not hasattr(mod, "qweight"):
            continue
        if hasattr(mod, "dequantize_weight"):  # GPTQ: its unpacking, scales in fp32 → exact products
            mod.scales = mod.scales.float()
            w = mod.dequantize_weight().float().T
        else:  # AWQ (GEMM): its unpacking, scales in fp32
            w = dequantize_gemm(mod.qweight, mod.qzeros, mod.scales.float(), mod.bits, mod.group_size).T
        for part in ("qweight", "qzeros", "scales", "g_idx"):
            tensors.pop(f"{name}.{part}", None)
        tensors[f"{name}.weight"] = w.contiguous()
        count += 1
    save_twin(src, out, tensors)
    return count


# experts 64 wide, hidden 128: its groups of 32 divide both
TOOL = Tool("gptqmodel", 64, tuple(VARIANTS), _quantise, _write_twin, ("act-order",), frozenset(BROKEN_IN_GPTQMODEL))


if __name__ == "__main__":
    sys.exit(main(TOOL, __doc__.split("\n")[0]))
