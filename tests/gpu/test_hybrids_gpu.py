"""The GDN hybrids on the GPU in bf16 (fla's chunked prefill when installed, our Triton
recurrent decode): agreement with transformers' fp32 reference over a prompt of several GDN
chunks, identical tokens for every expert residency (the shared expert rides in the slots),
and a slice of random:qwen3.5-35b-a3b under a device cap with its state rows planned."""

from __future__ import annotations

import pytest
import torch
from hf_reference import torch_gdn_reference
from tolerances import bf16_logit_error

from edgemoe import LLM, SamplingParams
from edgemoe.testing.isolation import DeviceUse, isolated

SMALL_HYBRID = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
    num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, shared_expert_intermediate_size=128,
)
LONG = [(7 * i * i + 3 * i) % 150000 + 100 for i in range(700)]  # 10 GDN chunks and a part
PROMPTS = [[9707, 11, 1879, 0], list(range(2000, 2040)), LONG]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def hybrid_ckpt(make_ckpt):  # noqa: ANN001, ANN201
    return make_ckpt("qwen3_5_moe", **SMALL_HYBRID)


def greedy(path, **settings) -> list[list[int]]:  # noqa: ANN001, ANN003
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_offload_tokens_identical_to_resident(hybrid_ckpt) -> None:  # noqa: ANN001
    # Same kernels on one device, only where experts (the shared one included) live differs.
    resident = greedy(hybrid_ckpt, moe_backend="resident")
    assert greedy(hybrid_ckpt, moe_backend="offload", moe_slots=4) == resident


def test_bf16_gpu_agrees_with_fp32_reference(hybrid_ckpt, monkeypatch) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    with LLM(str(hybrid_ckpt), dtype="bfloat16", device="cuda", max_prefill_tokens=4096) as llm:
        out = llm.generate([LONG], GREEDY)[0].token_ids
        got = llm.prompt_logits(LONG + out).cpu().float()
    model = transformers.AutoModelForCausalLM.from_pretrained(hybrid_ckpt, dtype=torch.float32).eval()
    torch_gdn_reference(model, monkeypatch)
    with torch.no_grad():
        ref = model(torch.tensor([LONG + out])).logits[0]
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree  # top-1 flips only where the top-2 gap is inside the error
    # A GDN layer rounds to bf16 about twice as often as an attention layer (conv, gates,
    # normalised q/k and the rule's bf16 products, gated norm): count each layer twice.
    typical, worst = bf16_logit_error(2 * SMALL_HYBRID["num_hidden_layers"])
    err, scale = (ref - got).abs(), ref.std().item()
    assert err.mean().item() < typical * scale and err.max().item() < worst * scale


@isolated  # measures the driver-counted device memory of a fresh process
def test_preset_slice_plans_state_rows_under_the_cap() -> None:
    cap = 6 * 2**30
    model = "random:qwen3.5-35b-a3b?num_hidden_layers=8"
    use = DeviceUse()  # before this process's CUDA context: the parent pytest's share left out
    with LLM(model, device="cuda", gpu_memory="6GiB", max_running_requests=64, kv_tokens=16384) as llm:
        plan = llm.engine.runtime.plan
        assert plan.state_rows >= 1 and plan.max_running <= plan.state_rows
        out = llm.generate([list(range(1000, 1000 + 3000)), [5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))
        assert all(len(o.token_ids) == 8 for o in out)
        peak = use.now()
    assert peak <= cap, peak / 2**30


def test_prefix_hits_and_host_revivals_are_bitwise_the_cold_run(hybrid_ckpt) -> None:  # noqa: ANN001
    """A hit restores a bitwise copy of the state the cold run had at that boundary and
    reuses its KV pages, so the remaining chunk computes exactly what the cold run did;
    after a trip through pinned host memory (async copies both ways) too."""
    with LLM(str(hybrid_ckpt), dtype="bfloat16", device="cuda", host_cache="256MiB") as llm:
        cold = llm.generate([LONG], GREEDY)[0]
        hit = llm.generate([LONG], GREEDY)[0]
        cache = llm.engine.prefix_cache
        cache.evict(cache.total_pages)
        revived = llm.generate([LONG], GREEDY)[0]
    assert hit.num_cached_tokens == revived.num_cached_tokens == (len(LONG) - 1) // 16 * 16
    assert hit.token_ids == revived.token_ids == cold.token_ids
