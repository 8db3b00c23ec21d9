"""Engine flag combinations a demanding user tries (a CPU campaign over the settings):
each either runs as asked or is refused by a one-line message naming the flag, never
ignored, never a traceback from deep inside the engine."""

from __future__ import annotations

import pytest

from edgemoe import LLM, SamplingParams
from edgemoe.config import EngineConfig

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPT = [9707, 11, 1879]


@pytest.mark.parametrize("name", ["kv_tokens", "max_model_len", "moe_slots"])
def test_zero_is_refused_not_read_as_unset(name: str) -> None:
    """0 is a value, not None: `--kv-tokens 0` once planned the default KV cache and
    `--max-model-len 0` the model's context, silently."""
    flag = name.replace("_", "-")
    with pytest.raises(ValueError, match=rf"{name} \(--{flag}\) must be >= 1 \(got 0\)"):
        EngineConfig.from_kwargs(**{name: 0})
    EngineConfig.from_kwargs(**{name: None})  # unset: planned
    EngineConfig.from_kwargs(**{name: 1})


@pytest.mark.parametrize("backend", ["offload", "cpu", "resident", "auto"])
def test_hybrid_fraction_is_refused_off_the_hybrid_backend(backend: str) -> None:
    """`--moe-hybrid-fraction` fixes hybrid's CPU share; the other backends ran without
    reading it (offload computed nothing on the CPU, cpu everything)."""
    with pytest.raises(ValueError, match=rf"moe_hybrid_fraction \(--moe-hybrid-fraction\).*--moe-backend {backend}"):
        EngineConfig.from_kwargs(moe_backend=backend, moe_hybrid_fraction=0.5)
    EngineConfig.from_kwargs(moe_backend="hybrid", moe_hybrid_fraction=0.5, expert_cache="host")
    EngineConfig.from_kwargs(moe_backend="hybrid", moe_hybrid_fraction=0.5, expert_cache="device")


def test_slots_are_refused_with_resident_experts() -> None:
    """`--moe-backend resident --moe-slots N` planned no slot at all, silently (auto keeps
    them: it may choose the slot cache)."""
    with pytest.raises(ValueError, match=r"moe_slots \(--moe-slots\).*--moe-backend resident"):
        EngineConfig.from_kwargs(moe_backend="resident", moe_slots=4)
    for backend in ("offload", "cpu", "hybrid", "auto"):
        EngineConfig.from_kwargs(moe_backend=backend, moe_slots=4)


@pytest.mark.parametrize("page_size", [32, 10**6, 2**70])
def test_a_page_beyond_the_kv_cache_is_refused(qwen3_ckpt, page_size: int) -> None:  # noqa: ANN001
    """The pool holds whole pages: a page larger than the planned KV cache allocated more
    than the plan said (10**6 tokens: 2·10**6 tokens' KV for a plan of 8,192; 2**70: a torch
    overflow from inside the pool's allocation)."""
    refused = rf"page_size \(--page-size\) {page_size} is more than the KV cache's 16 tokens"
    with pytest.raises(ValueError, match=refused):
        LLM(str(qwen3_ckpt), device="cpu", dtype="float32", kv_tokens=16, page_size=page_size)
    with LLM(str(qwen3_ckpt), device="cpu", dtype="float32", kv_tokens=16, page_size=16) as llm:  # one whole page
        assert llm.engine.runtime.pool.num_pages * llm.engine.runtime.pool.page_size == 16
        assert len(llm.generate([PROMPT], GREEDY)[0].token_ids) == 4


def test_a_tiny_context_keeps_its_default_page(qwen3_ckpt) -> None:  # noqa: ANN001
    """A context shorter than the default page (its KV plan too) still runs, in one page."""
    with LLM(str(qwen3_ckpt), device="cpu", dtype="float32", max_model_len=4) as llm:
        assert llm.engine.runtime.plan.kv_tokens < 16 and llm.engine.runtime.pool.num_pages == 1
        out = llm.generate([[9707]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
        assert len(out.token_ids) == 3 and out.finish_reason == "length"


def test_unparseable_gpu_memory_is_refused_on_the_cpu_too(qwen3_ckpt) -> None:  # noqa: ANN001
    """A cap the GPU run would refuse was accepted on the CPU (where it caps nothing)."""
    with pytest.raises(ValueError, match=r"gpu_memory \(--gpu-memory\): cannot parse size 'lots'"):
        LLM(str(qwen3_ckpt), device="cpu", dtype="float32", gpu_memory="lots")


def test_cpu_share_refusal_names_the_flags(qwen3_ckpt) -> None:  # noqa: ANN001
    """hybrid's fixed CPU quota on the device cache runs the C kernel, which has no float32
    path (the CPU's default dtype): the refusal says which flags give it one."""
    from edgemoe.kernels.cpu_kernel import CpuExperts

    if not CpuExperts(threads=1).native:
        pytest.skip("no C expert kernel on this machine")
    with pytest.raises(ValueError, match=r"--dtype bfloat16.*--expert-dtype.*--expert-cache host"):
        LLM(str(qwen3_ckpt), device="cpu", dtype="float32", moe_backend="hybrid", expert_cache="device",
            cpu_experts_per_layer=1, moe_slots=4)
    # what the message offers runs: bf16 weights on the C kernel
    with LLM(str(qwen3_ckpt), device="cpu", dtype="bfloat16", moe_backend="hybrid", expert_cache="device",
             cpu_experts_per_layer=1, moe_slots=4) as llm:
        assert len(llm.generate([PROMPT], GREEDY)[0].token_ids) == 4
        assert llm.stats()["moe"]["experts_cpu"] > 0


def test_cpu_share_refusal_without_the_c_kernel_names_the_kernel(qwen3_ckpt, monkeypatch) -> None:  # noqa: ANN001
    """On a CPU without AVX2 `auto` takes torch's kernel (as `EDGEMOE_CPU_KERNEL=torch` does here):
    the refusal names that cause, not the dtype flags, which would not help."""
    monkeypatch.setenv("EDGEMOE_CPU_KERNEL", "torch")
    with pytest.raises(ValueError, match=r"compiled C expert kernel.*'torch'.*--expert-cache host") as caught:
        LLM(str(qwen3_ckpt), device="cpu", dtype="bfloat16", moe_backend="hybrid", expert_cache="device",
            cpu_experts_per_layer=1, moe_slots=4)
    assert "--dtype" not in str(caught.value)
