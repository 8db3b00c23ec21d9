"""transformers as the reference for the hybrid model tests (qwen3_next, qwen3_5_moe,
qwen4_exp): eager float32 and float64 models, their greedy tokens, and the near-tie rule
for a greedy divergence. Importable from any test (tests/ is on sys.path, conftest.py)."""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
from tolerances import peer_atol


class Reference(NamedTuple):
    path: Any
    model: Any  # transformers, float32
    model64: Any  # transformers, float64: the exact reference for logits
    expected: list[list[int]]  # its greedy tokens per prompt


def hf_model(path, dtype: torch.dtype):  # noqa: ANN001, ANN201
    import transformers

    # eager experts: the grouped-GEMM path has no float64 kernel
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:  # noqa: ANN001
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
            pad_token_id=151643,
        )
    return out[0, len(prompt) :].tolist()


def logits_atol(ref: Reference, seq: list[int]) -> tuple[torch.Tensor, float]:
    """(float64 reference logits [T, V], the fp32 tolerance against them: see tolerances.peer_atol)."""
    with torch.no_grad():
        exact = ref.model64(torch.tensor([seq])).logits[0]
        peer = (ref.model(torch.tensor([seq])).logits[0].double() - exact).abs().max().item()
    # longest plain reduction: the context (the tiny models' hidden size 64 and expert widths are shorter)
    return exact, peer_atol(torch.float32, peer, max(64, len(seq)), exact.abs().max().item())


def assert_same_or_near_tie(ref: Reference, prompt: list[int], want: list[int], have: list[int]) -> None:
    """`have` equals the reference's `want`, or first differs where the reference's top two
    logits are within the logits tolerance (a near-tie fp32 rounding may break either way)."""
    if have == want:
        return
    j = next(i for i, (a, b) in enumerate(zip(want, have, strict=True)) if a != b)
    exact, atol = logits_atol(ref, prompt + want[:j])
    margin = (exact[-1, want[j]] - exact[-1, have[j]]).item()
    assert margin <= 2 * atol, f"diverged at token {j} with a reference margin {margin:.3g} > {2 * atol:.3g}"


def torch_function(fn):  # noqa: ANN001, ANN201
    """The torch function under transformers' kernel-hub decorators: without the `kernels`
    package, a `functools.wraps` wrapper (`__wrapped__`); with it (a dependency of
    transformers since 5.25), a `kernels` `Func` module whose forward closes over that
    wrapper (`func`) and has no `__wrapped__`."""
    if isinstance(fn, torch.nn.Module):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals["func"]
    return inspect.unwrap(fn)


def torch_gdn_reference(model: torch.nn.Module, monkeypatch) -> None:  # noqa: ANN001
    """With fla-core importable (it is carried to the GPU machine), transformers swaps its
    GDN and causal-conv functions for fla's Triton kernels, which refuse CPU tensors: put
    the torch functions (`torch_function`) back in the model's modules for the reference."""
    import importlib

    for cls in {type(m) for m in model.modules()}:
        mod = importlib.import_module(cls.__module__)
        for name in dir(mod):
            fn = getattr(mod, name)
            if callable(fn) and ("delta_rule" in name or "causal_conv1d" in name):
                unwrapped = torch_function(fn)
                if unwrapped is not fn:
                    monkeypatch.setattr(mod, name, unwrapped)
