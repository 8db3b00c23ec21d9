"""The GDN hybrids (qwen3_next, qwen3_5_moe) against transformers: greedy tokens and fp32
logits, chunked and one-shot prefill (chunks that are and are not multiples of the GDN
chunk, 64), page sizes 1 and 16, experts offloaded to a pool of top-k slots."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_reference import (
    Reference,
    assert_same_or_near_tie,
    hf_greedy,
    hf_model,
    logits_atol,
)

from edgemoe import LLM, SamplingParams

transformers = pytest.importorskip("transformers")

PROMPTS = [
    [9707, 11, 1879, 0],
    list(range(2000, 2023)),
    [151644, 872, 198, 3838, 374, 264, 1632, 30, 151645, 198, 151644, 77091, 198],
    [(7 * i * i + 3 * i) % 150000 + 100 for i in range(100)],  # a whole GDN chunk (64) and a part
]
NEW_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
F32 = dict(torch_dtype="float32")
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_next": ("qwen3_next", F32),
    # a dense MLP layer, a shared expert of its own width (the dense path), unnormalised top-k
    "qwen3_next-dense": ("qwen3_next", {**F32, "mlp_only_layers": [1], "shared_expert_intermediate_size": 48,
                                       "norm_topk_prob": False}),
    "qwen3_5_moe": ("qwen3_5_moe", F32),  # multimodal layout: text_config, model.language_model.*
    "qwen3_5_moe_text": ("qwen3_5_moe_text", F32),
}


@pytest.fixture(scope="module")
def reference(make_ckpt):  # noqa: ANN001, ANN201
    """reference(variant) -> Reference, built once per variant."""
    built: dict[str, Reference] = {}

    def get(name: str) -> Reference:
        if name not in built:
            model_type, overrides = VARIANTS[name]
            path = make_ckpt(model_type, **overrides)
            model = hf_model(path, torch.float32)
            built[name] = Reference(path, model, hf_model(path, torch.float64), [hf_greedy(model, p, NEW_TOKENS) for p in PROMPTS])
        return built[name]

    return get


def assert_greedy(ref: Reference, got: list[list[int]], which: tuple[int, ...] = tuple(range(len(PROMPTS)))) -> None:
    """Tokens (of the prompts `which`) equal the reference's, or first differ at a near-tie."""
    for i, have in zip(which, got, strict=True):
        assert_same_or_near_tie(ref, PROMPTS[i], ref.expected[i], have)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_batch_and_alone_match_transformers(reference, variant: str) -> None:  # noqa: ANN001
    ref = reference(variant)
    with LLM(str(ref.path), dtype="float32") as llm:
        assert_greedy(ref, [o.token_ids for o in llm.generate(PROMPTS, GREEDY)])
        if variant == "qwen3_5_moe":  # alone too (the batch's company changes nothing)
            assert_greedy(ref, [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS])
    assert all(len(set(t)) > 4 for t in ref.expected), "degenerate reference output: weak test"


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_next-dense", "qwen3_5_moe"])
def test_logits_match_float64_reference_at_every_position(reference, variant: str) -> None:  # noqa: ANN001
    ref = reference(variant)
    seq = PROMPTS[3] + ref.expected[3]
    with LLM(str(ref.path), dtype="float32", max_prefill_tokens=4096) as llm:
        ours = llm.prompt_logits(seq).double()
    exact, atol = logits_atol(ref, seq)
    torch.testing.assert_close(ours, exact, atol=atol, rtol=0)


SERVING = {
    "page1-chunk7": dict(page_size=1, max_prefill_tokens=7),  # chunks far from the GDN chunk grid
    "page16-chunk64": dict(page_size=16, max_prefill_tokens=64),  # chunks on the grid
    "page16-chunk100": dict(page_size=16, max_prefill_tokens=100),
    "offload-topk-slots": dict(moe_backend="offload", moe_slots=2),  # top_k = 2: every layer in waves
    "overlap-page4": dict(page_size=4, overlap=True),  # decode ids read on the device, stop rules a step behind
}


@pytest.mark.parametrize("serving", list(SERVING))
@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5_moe"])
def test_chunking_paging_and_offload_keep_tokens(reference, variant: str, serving: str) -> None:  # noqa: ANN001
    ref = reference(variant)
    which = (0, 3)  # a short prompt and one across the GDN chunk grid
    with LLM(str(ref.path), dtype="float32", **SERVING[serving]) as llm:
        assert_greedy(ref, [o.token_ids for o in llm.generate([PROMPTS[i] for i in which], GREEDY)], which)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5_moe"])
def test_prefix_hits_and_host_tier_revivals_keep_tokens(reference, variant: str, page_size: int) -> None:  # noqa: ANN001
    """A hit resumes from a GDN state snapshot: the same prompt again, the next agent turn,
    and both after every page and snapshot was evicted to the host tier and came back."""
    ref = reference(variant)
    prompt, want = PROMPTS[3], ref.expected[3]
    turn2 = prompt + want + [31, 32, 33]
    want2 = hf_greedy(ref.model, turn2, NEW_TOKENS)
    with LLM(str(ref.path), dtype="float32", page_size=page_size, host_cache="32MiB") as llm:
        cache = llm.engine.prefix_cache
        assert llm.generate([prompt], GREEDY)[0].token_ids == want
        again = llm.generate([prompt], GREEDY)[0]
        # the prompt's last page boundary before its final token has a snapshot
        assert again.token_ids == want and again.num_cached_tokens == (len(prompt) - 1) // page_size * page_size
        nxt = llm.generate([turn2], GREEDY)[0]
        assert nxt.token_ids == want2 and nxt.num_cached_tokens > len(prompt)
        cache.evict(cache.total_pages)
        assert cache.total_pages == 0 and cache.num_snapshots == 0 and cache.host.num_snapshots >= 2
        revived = llm.generate([prompt, turn2], GREEDY)
    assert [o.token_ids for o in revived] == [want, want2]
    assert revived[0].num_cached_tokens == again.num_cached_tokens and revived[1].num_cached_tokens > len(prompt)


def test_stacked_expert_checkpoints_load_the_same_model(reference, make_ckpt) -> None:  # noqa: ANN001
    """Qwen3.5's checkpoints ship each layer's experts stacked (`mlp.experts.gate_up_proj`
    [E, 2I, H], `down_proj` [E, H, I]); the same values per expert give the same model,
    in RAM banks or mapped from the files, and transformers reads it completely."""
    ref = reference("qwen3_5_moe")
    stacked = make_ckpt("qwen3_5_moe", stacked_experts=True, **F32)
    _, info = transformers.AutoModelForCausalLM.from_pretrained(stacked, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    with LLM(str(ref.path), dtype="float32") as llm:
        want = llm.prompt_logits(PROMPTS[3])
    for store in ("pageable", "mmap"):
        with LLM(str(stacked), dtype="float32", expert_store=store) as llm:
            assert torch.equal(llm.prompt_logits(PROMPTS[3]), want), store


@pytest.mark.parametrize("variant", ["qwen3_5_moe", "qwen3_next-dense"])
def test_the_device_cache_cpu_share_runs_them(reference, variant: str, c_expert_kernel) -> None:  # noqa: ANN001
    """hybrid on the device cache with bf16 experts, both of the share's rules (the
    100-token prompt by the prompt rule, decode by the live quota), beside the shared
    expert (and a dense layer): the CPU's experts are counted and the texts are the
    model's tokens (exactness of the share: tests/moe/test_cpu_share.py)."""
    ref = reference(variant)
    with LLM(str(ref.path), dtype="bfloat16", moe_backend="hybrid", expert_cache="device", moe_slots=4,
             prompt_cpu=True) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        moe, vocab = llm.stats()["moe"], llm.engine.vocab_size
    assert all(len(t) == NEW_TOKENS and all(0 <= i < vocab for i in t) for t in got)
    assert moe["experts_cpu"] > 0 and moe["prompt_cpu"] is True
