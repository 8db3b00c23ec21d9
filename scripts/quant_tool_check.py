"""What `gptqmodel_check.py` and `llmcompressor_check.py` share: tiny random models of
every family in transformers' own classes, the dense fp32 twin of a quantised checkpoint
written from a quantisation tool's own dequantisation, and our load of each checkpoint
against transformers on its twin."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2023)), list(range(40000, 40061, 3))]


def families(d: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """family → (transformers config class, kwargs), the experts' width `d` (a multiple of
    the tool's group), hidden 2d."""
    linear = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=d // 2,
                  linear_value_head_dim=d // 2)
    moe = dict(num_experts=8, num_experts_per_tok=2)
    return {
        "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=4 * d, moe_intermediate_size=d, head_dim=d // 2,
                                             norm_topk_prob=True, **moe)),
        "mixtral": ("MixtralConfig", dict(intermediate_size=d, head_dim=d // 2, num_local_experts=8,
                                          num_experts_per_tok=2)),
        "olmoe": ("OlmoeConfig", dict(intermediate_size=d, **moe)),
        "qwen3_next": ("Qwen3NextConfig", dict(intermediate_size=4 * d, moe_intermediate_size=d, head_dim=d // 2,
                                               shared_expert_intermediate_size=d, norm_topk_prob=True,
                                               full_attention_interval=2, **moe, **linear)),
        "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", dict(moe_intermediate_size=d, head_dim=d // 2,
                                                           shared_expert_intermediate_size=d,
                                                           layer_types=["linear_attention", "full_attention"],
                                                           **moe, **linear)),
    }


def tiny_model(family: str, out: Path, d: int) -> Path:
    """A random bf16 model of `family`, saved by transformers, with a tokenizer (the tools
    want one; calibration is by token ids, so any will do)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    cls, kw = families(d)[family]
    config = getattr(transformers, cls)(vocab_size=151936, hidden_size=2 * d, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                        initializer_range=0.1, bos_token_id=151643, eos_token_id=151645, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out)
    words = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "<unk>": 1}, "<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()  # a token a word (auto-round calibrates on text)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=words,
                                               eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(out)
    return out


def save_twin(src: Path, out: Path, tensors: dict[str, Any]) -> None:
    """`tensors` (every linear dense) as an unquantised fp32 checkpoint beside `src`'s files."""
    from safetensors.torch import save_file

    config = json.loads((src / "config.json").read_text())
    if config["model_type"] == "mixtral":  # the tools' expert names → those transformers loads
        tensors = {_classic_mixtral(k): v for k, v in tensors.items()}
    config.pop("quantization_config")
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "generation_config.json":
            shutil.copy(f, out / f.name)


def _classic_mixtral(name: str) -> str:
    for theirs, classic in ((".mlp.", ".block_sparse_moe."), (".gate_proj.", ".w1."), (".up_proj.", ".w3."),
                            (".down_proj.", ".w2.")):
        name = name.replace(theirs, classic)
    return name


def compare(ckpt: Path, twin: Path, **llm_kw: Any) -> tuple[bool, str]:
    """Our load of `ckpt` against transformers on `twin`: the same fp32 weights, sums in
    another order, so far below 1e-3 of the logits."""
    import torch
    import transformers

    from edgemoe import LLM

    ref = transformers.AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    worst, scale = 0.0, 0.0
    with LLM(str(ckpt), dtype="float32", **llm_kw) as llm:
        fmt = llm._engine().runtime.plan.expert_format
        for p in PROMPTS:
            ours = llm.prompt_logits(p)
            with torch.no_grad():
                want = ref(torch.tensor([p])).logits[0]
            worst, scale = max(worst, (ours - want).abs().max().item()), max(scale, want.abs().max().item())
    ok = worst <= 1e-3 * max(scale, 1.0)
    return ok, f"experts {fmt}{' ' + str(llm_kw) if llm_kw else ''}: max |Δ logit| {worst:.2e} of max |logit| {scale:.2f}"


def check(root: Path, exact_unquantised: tuple[str, ...]) -> int:
    """Every `<name>` beside its `<name>-twin` under `root`; names containing one of
    `exact_unquantised` (their experts quantised again at load) with `--expert-dtype bf16`."""
    from edgemoe.models.checkpoint_files import CheckpointError
    from edgemoe.quant.published import QuantConfigError

    failed = 0
    for twin in sorted(root.glob("*-twin")):
        ckpt = twin.with_name(twin.name.removesuffix("-twin"))
        kw = {"expert_dtype": "bf16"} if any(s in ckpt.name for s in exact_unquantised) else {}
        try:
            ok, said = compare(ckpt, twin, **kw)
        except (QuantConfigError, CheckpointError) as e:
            ok, said = False, f"refused: {e}"
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {ckpt.name}: {said}", flush=True)
    return 1 if failed else 0


@dataclass(frozen=True)
class Tool:
    """A quantisation tool's half of the check."""

    name: str
    width: int  # the experts' width d: a multiple of its groups
    variants: tuple[str, ...]
    quantise: Callable[[Path, Path, str], None]  # (bf16 model, out, variant)
    write_twin: Callable[[Path, Path], int]  # (checkpoint, out) → quantised linears
    exact_unquantised: tuple[str, ...] = ()  # variants quantised again at load
    broken: frozenset[tuple[str, str]] = frozenset()  # (family, variant) the tool fails on by itself


def make(tool: Tool, root: Path, names: list[str], variants: list[str]) -> None:
    for family in names:
        src = tiny_model(family, root / f"{family}-bf16", tool.width)
        for variant in variants:
            if (family, variant) in tool.broken:
                print(f"{family}-{variant}: skipped ({tool.name} fails on it)", flush=True)
                continue
            ckpt = root / f"{family}-{variant}"
            try:
                tool.quantise(src, ckpt, variant)
                n = tool.write_twin(ckpt, root / f"{family}-{variant}-twin")
                print(f"{ckpt.name}: {n} quantised linears, twin written", flush=True)
            except Exception as e:  # noqa: BLE001 — report and go on to the next variant
                print(f"{ckpt.name}: {tool.name} failed: {type(e).__name__}: {e}", flush=True)


def main(tool: Tool, description: str) -> int:
    names = list(families(tool.width))
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("what", choices=("make", "check"))
    ap.add_argument("root", type=Path)
    ap.add_argument("--families", nargs="+", default=names, choices=names)
    ap.add_argument("--variants", nargs="+", default=list(tool.variants), choices=list(tool.variants))
    args = ap.parse_args()
    if args.what == "make":
        make(tool, args.root, args.families, args.variants)
        return 0
    return check(args.root, tool.exact_unquantised)
