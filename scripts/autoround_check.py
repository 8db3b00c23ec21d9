"""AutoRound checkpoints written by Intel's auto-round itself, read by auto-round and by us.

Intel publishes many MoE models this way (`quant_method: auto-round`, the layout in
`packing_format`: AutoGPTQ's by default, gptqmodel's, or AutoAWQ's for asymmetric weights;
per-layer widths in `extra_config`). auto-round comes with llm-compressor, so this runs in
llmcompressor_check.py's side venv:

    HF_HUB_OFFLINE=1 /tmp/lc/bin/python scripts/autoround_check.py make /tmp/arc
    .venv/bin/python scripts/autoround_check.py check /tmp/arc

Quantisation is auto-round's RTN mode (`iters=0`: the layouts are what is checked, not its
tuning). The twin holds each linear as auto-round's own kernel computes it, on the
identity with its scales in fp32 (exact). "mixed" keeps attention at 8 bits in a 4-bit
checkpoint: those linears decode by their own width.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from quant_tool_check import Tool, main, save_twin

# name → (bits, sym, export format, layer_config)
VARIANTS = {
    "sym": (4, True, "auto_round", None),  # packed as auto_round:auto_gptq
    "asym": (4, False, "auto_round", None),  # packed as auto_round:auto_awq
    "gptqmodel": (4, True, "auto_round:gptqmodel", None),
    "mixed": (4, True, "auto_round", {"self_attn": {"bits": 8}}),
}


def _quantise(src: Path, out: Path, variant: str) -> None:
    import torch
    import transformers
    from auto_round import AutoRound

    bits, sym, fmt, layers = VARIANTS[variant]
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    text = [" ".join(["a"] * 40)] * 16  # RTN still runs the blocks once
    ar = AutoRound(model, tok, bits=bits, group_size=128, sym=sym, iters=0, device_map="cpu", dataset=text,
                   nsamples=8, seqlen=16, layer_config=layers or {})
    ar.quantize_and_save(str(out), format=fmt)
    (nested,) = [p.parent for p in out.glob("*/config.json")]  # auto-round writes into a folder of its own
    for f in nested.iterdir():
        f.rename(out / f.name)
    nested.rmdir()


def _write_twin(src: Path, out: Path) -> int:
    """Each quantised linear as auto-round computes it, in fp32 (exact): its AWQ
    dequantiser for the auto_awq packing (its kernel for that one needs a compiled
    library), else its torch kernel on the identity."""
    from safetensors.torch import load_file

    tensors = {}
    for f in src.glob("*.safetensors"):
        tensors |= load_file(str(f))
    qc = json.loads((src / "config.json").read_text())["quantization_config"]
    dense = _awq_weights(tensors, qc) if "awq" in qc.get("packing_format", "") else _kernel_weights(src)
    for name, w in dense.items():
        for part in ("qweight", "qzeros", "scales", "g_idx"):
            tensors.pop(f"{name}.{part}", None)
        tensors[f"{name}.weight"] = w.contiguous()
    save_twin(src, out, tensors)
    return len(dense)


def _awq_weights(tensors: dict, qc: dict) -> dict:
    from auto_round.export.export_to_awq.utils import dequantize_gemm

    names = [k.removesuffix(".qweight") for k in tensors if k.endswith(".qweight")]
    return {n: dequantize_gemm(tensors[f"{n}.qweight"], tensors[f"{n}.qzeros"], tensors[f"{n}.scales"].float(),
                               qc["bits"], qc["group_size"]).T for n in names}


def _kernel_weights(src: Path) -> dict:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float16, device_map="cpu")
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "qweight"):
            mod.scales = mod.scales.float()
            with torch.no_grad():
                out[name] = mod(torch.eye(mod.infeatures)).float().T
    return out


# experts 128 wide, hidden 256: groups of 128 divide both
# auto-round 0.15.1's own failure on the hybrids: its calibration pass hands their attention a
# long-typed mask ("Expected attn_mask dtype to be bool or float"), except on the asym path
BROKEN_IN_AUTOROUND = frozenset((f, v) for f in ("qwen3_next", "qwen3_5_moe_text") for v in ("sym", "gptqmodel", "mixed"))
TOOL = Tool("auto-round", 128, tuple(VARIANTS), _quantise, _write_twin, broken=BROKEN_IN_AUTOROUND)


if __name__ == "__main__":
    sys.exit(main(TOOL, __doc__.split("\n")[0]))
