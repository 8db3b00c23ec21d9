"""Qwen3.8-Flash-Next (qwen4_exp) against transformers 5.24: greedy tokens and fp32 logits
with QSA selecting sparsely (budget 8 of 150+ tokens) and PLE on two GDN layers; the same
with a budget that keeps every token and no PLE; the multimodal layout; chunked prefill
and page sizes; prefix-cache hits and host-tier revivals (the snapshot carries the GDN,
n-gram and PLE conv states and the pages carry the index keys)."""

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
    [151644, 872, 198, 3838, 374, 264, 1632, 30, 151645, 198, 151644, 77091, 198],  # an EOS mid-prompt: n-gram segments
    [(7 * i * i + 3 * i) % 150000 + 100 for i in range(100)],  # a GDN chunk and a part; 25 QSA blocks, 2 kept
]
NEW_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
F32 = dict(torch_dtype="float32")
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "sparse-ple": ("qwen4_exp_text", F32),
    "multimodal": ("qwen4_exp", F32),  # text_config, model.language_model.*
    # every token selected (budget >> context), no PLE, a sigmoid GDN gate, three streams
    "dense-nople": ("qwen4_exp_text", {**F32, "indexer_budget": 4096, "ple_layer_ids": [], "hc_count": 3,
                                       "output_gate_type": "sigmoid"}),
}


@pytest.fixture(scope="module")
def reference(make_ckpt):  # noqa: ANN001, ANN201
    built: dict[str, Reference] = {}

    def get(name: str) -> Reference:
        if name not in built:
            model_type, overrides = VARIANTS[name]
            path = make_ckpt(model_type, **overrides)
            model = hf_model(path, torch.float32)
            # the multimodal layout is checked by its logits on the longest prompt: one generate
            prompts = PROMPTS[3:] if model_type == "qwen4_exp" else PROMPTS
            expected = [[] for _ in PROMPTS[: len(PROMPTS) - len(prompts)]] + [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
            built[name] = Reference(path, model, hf_model(path, torch.float64), expected)
        return built[name]

    return get


def assert_greedy(ref: Reference, got: list[list[int]]) -> None:
    """Tokens equal the reference's, or first differ at a near-tie."""
    for prompt, want, have in zip(PROMPTS, ref.expected, got, strict=True):
        assert_same_or_near_tie(ref, prompt, want, have)


SERVING = {
    "one-shot": {},
    "page1-chunk7": dict(page_size=1, max_prefill_tokens=7),  # chunks across QSA blocks, n-grams and GDN chunks
    "offload-topk-slots": dict(moe_backend="offload", moe_slots=2),  # top_k = 2: every layer in waves
    # step N+1 launched before step N's ids reach the host: n-gram contexts from device ids
    "overlap-page4-chunk7": dict(page_size=4, max_prefill_tokens=7, overlap=True),
}


@pytest.mark.parametrize("serving", list(SERVING))
def test_greedy_matches_transformers_chunked_paged_offloaded(reference, serving: str) -> None:  # noqa: ANN001
    ref = reference("sparse-ple")
    with LLM(str(ref.path), dtype="float32", **SERVING[serving]) as llm:
        assert_greedy(ref, [o.token_ids for o in llm.generate(PROMPTS, GREEDY)])
        if serving == "one-shot":  # alone: the batch's company changes nothing
            assert llm.generate([PROMPTS[2]], GREEDY)[0].token_ids == ref.expected[2]
    assert all(len(set(t)) > 4 for t in ref.expected), "degenerate reference output: weak test"


def test_dense_selection_without_ple_matches_transformers(reference) -> None:  # noqa: ANN001
    ref = reference("dense-nople")
    with LLM(str(ref.path), dtype="float32") as llm:
        assert_greedy(ref, [o.token_ids for o in llm.generate(PROMPTS, GREEDY)])


@pytest.mark.parametrize("variant", ["sparse-ple", "multimodal"])
def test_logits_match_float64_reference_at_every_position(reference, variant: str) -> None:  # noqa: ANN001
    ref = reference(variant)
    seq = PROMPTS[3] + ref.expected[3]
    with LLM(str(ref.path), dtype="float32", max_prefill_tokens=4096) as llm:
        ours = llm.prompt_logits(seq).double()
    exact, atol = logits_atol(ref, seq)
    torch.testing.assert_close(ours, exact, atol=atol, rtol=0)


@pytest.mark.parametrize("page_size", [8])  # a page boundary inside the decoded tokens
def test_prefix_hits_and_host_tier_revivals_keep_tokens(reference, page_size: int) -> None:  # noqa: ANN001
    """A hit resumes from a snapshot (GDN, n-gram context and PLE conv states) and cached
    pages (K, V and index keys): the same prompt again, the next turn, and both after every
    page and snapshot went to the host tier and came back."""
    ref = reference("sparse-ple")
    prompt, want = PROMPTS[3], ref.expected[3]
    turn2 = prompt + want + [31, 32, 33]
    want2 = hf_greedy(ref.model, turn2, NEW_TOKENS)
    with LLM(str(ref.path), dtype="float32", page_size=page_size, host_cache="32MiB") as llm:
        cache = llm.engine.prefix_cache
        assert llm.generate([prompt], GREEDY)[0].token_ids == want
        again = llm.generate([prompt], GREEDY)[0]
        assert again.token_ids == want and again.num_cached_tokens == (len(prompt) - 1) // page_size * page_size
        nxt = llm.generate([turn2], GREEDY)[0]
        assert nxt.token_ids == want2 and nxt.num_cached_tokens > len(prompt)
        cache.evict(cache.total_pages)
        assert cache.total_pages == 0 and cache.host.num_snapshots >= 2
        revived = llm.generate([prompt, turn2], GREEDY)
    assert [o.token_ids for o in revived] == [want, want2]


def test_hash_constants_equal_transformers_buffers(reference) -> None:  # noqa: ANN001
    """The PLE tables' primes, offsets and multipliers we derive from config.json are the
    ones transformers derives (and saves as buffers)."""
    from edgemoe.models.loader import read_json
    from edgemoe.models.registry import model_module

    ref = reference("sparse-ple")
    arch = model_module("qwen4_exp_text").arch(read_json(ref.path / "config.json"))
    for g in arch.ple.layers:
        emb = ref.model.model.layers[g.layer].ple.ple_embedding
        assert list(g.multipliers) == emb.layer_multipliers.tolist()
        assert list(g.vocab_sizes) == emb.ngram_heads_vocab_sizes.tolist()
        assert list(g.offsets) == emb.ngram_heads_offsets.tolist()
        assert g.rows == emb.ngram_embedding.weight.shape[0]


def test_the_device_cache_cpu_share_runs_it(reference, c_expert_kernel) -> None:  # noqa: ANN001
    """hybrid on the device cache with bf16 experts (what the C kernel reads), both of the
    share's rules: the 100-token prompt's chunk by the prompt rule (`prompt_cpu`), decode
    steps by the live quota (hybrid starts at one CPU expert a layer); the CPU's experts are
    counted and the texts are the model's tokens (exactness: tests/moe/test_cpu_share.py)."""
    ref = reference("sparse-ple")
    with LLM(str(ref.path), dtype="bfloat16", moe_backend="hybrid", expert_cache="device", moe_slots=4,
             prompt_cpu=True) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        moe, vocab = llm.stats()["moe"], llm.engine.vocab_size
    assert all(len(t) == NEW_TOKENS and all(0 <= i < vocab for i in t) for t in got)
    assert moe["experts_cpu"] > 0 and moe["prompt_cpu"] is True and "cpu_quota_per_layer" in moe
