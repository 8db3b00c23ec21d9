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

import argparse
import json
import shutil
import sys
from pathlib import Path

# family → (transformers config class, kwargs); dimensions divisible by the group (32)
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=256, moe_intermediate_size=64, head_dim=32,
                                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", dict(intermediate_size=64, head_dim=32, num_local_experts=8, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=64, num_experts=8, num_experts_per_tok=2)),
    "qwen3_next": ("Qwen3NextConfig", dict(intermediate_size=256, moe_intermediate_size=64, head_dim=32,
                                           shared_expert_intermediate_size=64, num_experts=8,
                                           num_experts_per_tok=2, norm_topk_prob=True, full_attention_interval=2,
                                           linear_num_value_heads=4, linear_num_key_heads=2,
                                           linear_key_head_dim=32, linear_value_head_dim=32)),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", dict(moe_intermediate_size=64, head_dim=32,
                                                       shared_expert_intermediate_size=64, num_experts=8,
                                                       num_experts_per_tok=2, layer_types=["linear_attention",
                                                                                           "full_attention"],
                                                       linear_num_value_heads=4, linear_num_key_heads=2,
                                                       linear_key_head_dim=32, linear_value_head_dim=32)),
}
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
PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2023)), list(range(40000, 40061, 3))]


def _tiny_model(family: str, out: Path) -> Path:
    import torch
    import transformers

    cls, kw = FAMILIES[family]
    config = getattr(transformers, cls)(vocab_size=151936, hidden_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                        initializer_range=0.1, bos_token_id=151643, eos_token_id=151645, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out)
    # gptqmodel wants a tokenizer beside the model; calibration is by token ids, so any will do
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": 0, "<unk>": 1}
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "<unk>")),
                                               eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(out)
    return out


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
    from safetensors.torch import load_file, save_file

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
    config = json.loads((src / "config.json").read_text())
    if config["model_type"] == "mixtral":  # gptqmodel's module names → those transformers loads
        tensors = {_mixtral_name(k): v for k, v in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.pop("quantization_config")
    config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    return count


def _mixtral_name(name: str) -> str:
    for ours, theirs in ((".mlp.", ".block_sparse_moe."), (".gate_proj.", ".w1."), (".up_proj.", ".w3."),
                         (".down_proj.", ".w2.")):
        name = name.replace(ours, theirs)
    return name


def make(root: Path, families: list[str], variants: list[str]) -> None:
    for family in families:
        src = _tiny_model(family, root / f"{family}-bf16")
        for variant in variants:
            if (family, variant) in BROKEN_IN_GPTQMODEL:
                print(f"{family}-{variant}: skipped (gptqmodel 7.7 fails on it)", flush=True)
                continue
            ckpt = root / f"{family}-{variant}"
            try:
                _quantise(src, ckpt, variant)
                n = _write_twin(ckpt, root / f"{family}-{variant}-twin")
                print(f"{ckpt.name}: {n} quantised linears, twin written", flush=True)
            except Exception as e:  # noqa: BLE001 — report and go on to the next variant
                print(f"{ckpt.name}: gptqmodel failed: {type(e).__name__}: {e}", flush=True)


def _compare(ckpt: Path, twin: Path) -> tuple[bool, str]:
    import torch
    import transformers

    from edgemoe import LLM

    ref = transformers.AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    worst, scale = 0.0, 0.0
    # act-order: exact only unquantised (under auto its experts are quantised again at load)
    kw = {"expert_dtype": "bf16"} if "act-order" in ckpt.name else {}
    with LLM(str(ckpt), dtype="float32", **kw) as llm:
        fmt = llm._engine().runtime.plan.expert_format
        for p in PROMPTS:
            ours = llm.prompt_logits(p)
            with torch.no_grad():
                want = ref(torch.tensor([p])).logits[0]
            worst, scale = max(worst, (ours - want).abs().max().item()), max(scale, want.abs().max().item())
    # the same fp32 weights, sums in another order: far below 1e-3 of the logits
    ok = worst <= 1e-3 * max(scale, 1.0)
    return ok, f"experts {fmt}: max |Δ logit| {worst:.2e} of max |logit| {scale:.2f}"


def check(root: Path) -> int:
    from edgemoe.models.checkpoint_files import CheckpointError
    from edgemoe.quant.published import QuantConfigError

    failed = 0
    for twin in sorted(root.glob("*-twin")):
        ckpt = twin.with_name(twin.name.removesuffix("-twin"))
        try:
            ok, said = _compare(ckpt, twin)
        except (QuantConfigError, CheckpointError) as e:
            ok, said = False, f"refused: {e}"
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {ckpt.name}: {said}", flush=True)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("make", "check"))
    ap.add_argument("root", type=Path)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    if args.what == "make":
        make(args.root, args.families, args.variants)
        return 0
    return check(args.root)


if __name__ == "__main__":
    sys.exit(main())
