"""What every model family's GPU test checks (tests/gpu/test_*_gpu.py): fp32 on the GPU
against transformers' fp32 logits, the same greedy tokens for every expert residency and
with CUDA graphs off, and a slice of the real-shape preset under a device-memory cap."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tolerances import bf16_logit_error, network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.testing.isolation import DeviceUse

PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2040)), [(7 * i * i + 3 * i) % 150000 + 100 for i in range(300)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def greedy(path: Path, **settings: object) -> list[list[int]]:
    """bf16 greedy tokens of PROMPTS on the GPU (the Triton kernels, graphs unless turned off)."""
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def assert_residencies_agree(path: Path, slots: int = 6) -> None:
    """Offloaded to `slots` slots, and resident without graphs: the resident tokens."""
    resident = greedy(path, moe_backend="resident")
    assert greedy(path, moe_backend="offload", moe_slots=slots) == resident
    assert greedy(path, moe_backend="resident", no_cuda_graph=True) == resident


def assert_fp32_matches_transformers(path: Path, width: int) -> None:
    """Our fp32 prompt logits of PROMPTS[2] on the GPU are transformers' (eager, fp32) to
    fp32's reduction bound over sums of max(`width`, the prompt's length) terms."""
    import transformers

    seq = PROMPTS[2]
    with LLM(str(path), dtype="float32", device="cuda") as llm:
        got = llm.prompt_logits(seq).cpu()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        ref = model.cuda().eval()(torch.tensor([seq]).cuda()).logits[0].float().cpu()
    atol = network_atol(torch.float32, max(width, len(seq)), ref.abs().max().item())
    torch.testing.assert_close(got, ref, atol=atol, rtol=0)


def assert_slice_runs_under_cap(model: str, cap_gib: int, **settings: object) -> None:
    """A long and a short prompt through `model` (a preset slice) at `cap_gib` GiB: every
    token made, the driver-counted peak of this (fresh: `isolated`) process under the cap."""
    use = DeviceUse()
    with LLM(model, device="cuda", gpu_memory=f"{cap_gib}GiB", kv_tokens=8192, **settings) as llm:
        out = llm.generate([list(range(1000, 3000)), [5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))
        assert all(len(o.token_ids) == 8 for o in out)
        peak = use.now()
    assert peak <= cap_gib * 2**30, peak / 2**30


def assert_parted_only_at_near_ties(path: Path, prompts: list[list[int]], want: list[list[int]],
                                    got: list[list[int]], **settings: object) -> None:
    """`got`'s greedy texts against `want`'s (the bf16 run under `settings`): where one parts,
    `want`'s run's logits at that token are a near-tie (two bf16 logit errors apart) — a CPU
    expert's fp32 GEMV rounds apart from the GPU's kernel (then the texts follow other text)."""
    layers = json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"]
    _, worst = bf16_logit_error(layers)
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        for prompt, a, b in zip(prompts, want, got, strict=True):
            if a == b:
                continue
            j = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            logits = llm.prompt_logits(prompt + a[:j])[-1].float()
            margin = (logits[a[j]] - logits[b[j]]).item()
            assert margin <= 2 * worst * logits.std().item(), f"parted at token {j}, margin {margin:.3g}"
