"""`edgemoe bench quant-error`: how much each expert format changes each MoE layer's output.

The model runs once with its experts as stored (in `--dtype`, fp32 on the CPU), on random
prompts; every MoE layer's input and routing are captured. Then, per layer and format,
the routed experts are quantised and the layer's expert output recomputed on the same
inputs and routing (the dequantise-first reference, fp32): the relative error
||y_fmt - y|| / ||y|| (Frobenius over the captured tokens) is the figure — top-1
agreement on a random model would say little. JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from edgemoe.bench.decode import random_prompts
from edgemoe.bench.results import write_result
from edgemoe.kernels.moe_experts import expert_mlp
from edgemoe.quant import Parts, dequantise_expert, expert_format, quantise_expert


@dataclass
class Capture:
    """One MoE layer's inputs on the captured step: x [T, H], routing [T, K]."""

    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


def capture_layers(llm: Any, prompts: list[list[int]]) -> dict[int, Capture]:
    """Run `prompts` through the engine's prefill, keeping each MoE layer's last input."""
    executor = llm._engine().runtime.executor
    captured: dict[int, Capture] = {}
    # NOTE: both entries: a layer followed by another runs `forward_normed` (the next layer's
    # norm fused into the combine, which never calls `forward`), the last layer `forward`.
    originals = {name: getattr(executor, name) for name in ("forward", "forward_normed")}

    def spy(method):  # noqa: ANN001, ANN202
        def run(layer, x, topk_ids, topk_weights, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            captured[layer] = Capture(x.detach().float().cpu(), topk_ids.cpu(), topk_weights.float().cpu())
            return method(layer, x, topk_ids, topk_weights, *args, **kwargs)
        return run

    for name, method in originals.items():
        setattr(executor, name, spy(method))
    try:
        for p in prompts:
            llm.prompt_logits(p)
    finally:
        for name, method in originals.items():
            setattr(executor, name, method)
    return captured


def layer_output(c: Capture, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """sum_k w[t, k] · expert_{ids[t, k]}(x[t]) in fp32, experts given as (gate_up, down)."""
    y = torch.zeros_like(c.x)
    for e, (gate_up, down) in weights.items():
        t, k = torch.where(c.topk_ids == e)
        if t.numel():
            y.index_add_(0, t, expert_mlp(c.x[t], gate_up, down, F.silu) * c.topk_weights[t, k, None])
    return y


def relative_errors(banks: dict[int, Parts], captures: dict[int, Capture], formats: list[str]) -> dict[str, list[float]]:
    """Per format, per captured layer (ascending): ||y_fmt − y|| / ||y||, from the layers'
    unquantised banks (gate_up [E, 2I, H], down [E, H, I])."""
    out: dict[str, list[float]] = {f: [] for f in formats}
    for layer in sorted(captures):
        c = captures[layer]
        hidden, inter = banks[layer]["down"].shape[1:]
        routed = sorted(set(c.topk_ids.flatten().tolist()))
        dense = {e: (banks[layer]["gate_up"][e].float().cpu(), banks[layer]["down"][e].float().cpu()) for e in routed}
        ref = layer_output(c, dense)  # type: ignore[arg-type]
        for name in formats:
            fmt = expert_format(name, torch.bfloat16)
            q = {e: dequantise_expert(fmt, quantise_expert(fmt, gu[:inter], gu[inter:], dn), hidden, inter)
                 for e, (gu, dn) in dense.items()}
            out[name].append(float((layer_output(c, q) - ref).norm() / ref.norm()))
    return out


def run_quant_error(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from edgemoe import LLM

    fixed = {"expert_dtype": "bf16", "moe_backend": "resident"}  # the reference: every expert as stored, in bf16
    for name, value in fixed.items():
        if settings.get(name, value) != value:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {settings[name]}: bench quant-error runs with {flag} {value} (its default): it "
                             "quantises the experts itself, from the resident bf16 banks")
    settings = {**settings, **fixed}
    with LLM(**settings) as llm:
        runtime = llm._engine().runtime
        if runtime.model.arch.hidden_act != "silu":
            print("edgemoe bench quant-error: SiLU experts only")
            return 2
        prompts = random_prompts(args.prompts, args.prompt_tokens, llm._engine().vocab_size, seed=0)
        captures = capture_layers(llm, prompts)
        errors = relative_errors(runtime.executor.banks, captures, args.formats)
    layers = sorted(captures)
    print(f"relative error of each MoE layer's expert output (||y_fmt - y|| / ||y||, {len(prompts)} prompts "
          f"x {args.prompt_tokens} tokens; weights as stored = reference)")
    print("  layer " + "".join(f"{f:>10s}" for f in args.formats))
    for i, layer in enumerate(layers):
        print(f"  {layer:5d} " + "".join(f"{errors[f][i]:10.2e}" for f in args.formats))
    print("  mean  " + "".join(f"{statistics.fmean(errors[f]):10.2e}" for f in args.formats))
    path = write_result(args.out, "quant-error", {"model": settings.get("model"), "layers": layers, "errors": errors,
                                                  "prompts": args.prompts, "prompt_tokens": args.prompt_tokens})
    print(f"wrote {path}")
    return 0
