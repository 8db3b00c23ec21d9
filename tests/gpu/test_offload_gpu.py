"""Expert offload on the GPU in bf16: identical tokens for every slot-pool size, close
logits for the CPU paths, agreement with the fp32 reference, and the memory cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tolerances import bf16_logit_error

from edgemoe import LLM, SamplingParams
from edgemoe.testing.isolation import DeviceUse, isolated

PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2040)), list(range(40000, 40300, 3))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
EXPERTS = 16 * 4  # layers x experts of the small model


def num_layers(path: Path) -> int:
    return json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"]


def greedy_tokens(path, **settings) -> list[list[int]]:  # noqa: ANN001, ANN003
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def teacher_forced(path, seq: list[int], **settings) -> torch.Tensor:  # noqa: ANN001, ANN003
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return llm.prompt_logits(seq).cpu()


@pytest.fixture(scope="module")
def resident(small_ckpt):  # noqa: ANN001, ANN201
    return greedy_tokens(small_ckpt, moe_backend="resident")


@pytest.mark.parametrize("cache", ["device", "host"])  # device: the GPU default (--expert-cache auto)
@pytest.mark.parametrize("slots", [4, EXPERTS // 4, EXPERTS])
def test_offload_tokens_identical_to_resident(small_ckpt, resident, slots: int, cache: str) -> None:  # noqa: ANN001
    # Same kernels on the same device, only the residency differs: bitwise-equal logits.
    assert greedy_tokens(small_ckpt, moe_backend="offload", moe_slots=slots, expert_cache=cache) == resident


@pytest.mark.parametrize("backend", ["cpu", "hybrid"])
def test_cpu_paths_agree_with_resident(small_ckpt, resident, backend: str) -> None:  # noqa: ANN001
    # The CPU's bf16 GEMMs round differently from the GPU's: compare teacher-forced logits.
    seq = PROMPTS[1] + resident[1]
    ref = teacher_forced(small_ckpt, seq, moe_backend="resident")
    got = teacher_forced(small_ckpt, seq, moe_backend=backend, moe_slots=8)
    # top-1 flips only where the top-2 gap is inside the error; the tiny models' median
    # gap is > 0.3 logits (tests/testing), several times the typical error below
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree
    typical, worst = bf16_logit_error(num_layers(small_ckpt))
    err, scale = (ref - got).abs(), ref.std().item()
    # two bf16 computations: random walks add in quadrature, worst cases add
    assert err.mean().item() < 2**0.5 * typical * scale and err.max().item() < 2 * worst * scale


def test_bf16_gpu_agrees_with_fp32_reference(small_ckpt, resident) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    seq = PROMPTS[2] + resident[2]
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(small_ckpt, dtype=torch.float32)
    with torch.no_grad():
        ref = ref_model(torch.tensor([seq])).logits[0]
    got = teacher_forced(small_ckpt, seq, moe_backend="offload", moe_slots=8)
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree  # top-1 flips only inside the error, as above
    typical, worst = bf16_logit_error(num_layers(small_ckpt))
    err, scale = (ref - got).abs(), ref.std().item()  # the fp32 reference: exact to 2^-16 of this
    assert err.mean().item() < typical * scale and err.max().item() < worst * scale


MEDIUM = dict(
    hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
    num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512, tie_word_embeddings=True,
    max_position_embeddings=8192,
)


@isolated  # measures the driver-counted device memory of a fresh process
def test_device_memory_stays_under_the_cap(make_ckpt) -> None:  # noqa: ANN001
    """A model whose experts exceed the cap: long prompt + decode, driver-counted usage."""
    path = make_ckpt("qwen3_moe", **MEDIUM)
    cap = 2 * 2**30
    use = DeviceUse()  # before this process's CUDA context: the parent pytest's share left out
    with LLM(str(path), dtype="bfloat16", device="cuda", gpu_memory="2GiB", max_prefill_tokens=2048) as llm:
        engine = llm.engine
        assert engine.runtime.plan.backend == "auto"  # a slot cache: on the device (--expert-cache auto)
        rid = engine.add_request(list(range(1000, 7000)), SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        peak = use.peak_until_finished(engine, rid)
        moe = llm.stats()["moe"]
        assert moe["misses"] > 0 and moe["bytes_copied"] > 0
    assert peak <= cap, f"driver-counted peak {peak / 2**30:.2f} GiB > cap 2 GiB"
