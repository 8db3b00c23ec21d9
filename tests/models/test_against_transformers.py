"""Our engine against transformers, the oracle: greedy tokens and fp32 logits."""

from __future__ import annotations

import pytest
import torch
from tolerances import network_atol

from edgemoe import LLM, SamplingParams

transformers = pytest.importorskip("transformers")

PROMPTS = [
    [9707, 11, 1879, 0],
    list(range(2000, 2023)),
    [151644, 872, 198, 3838, 374, 264, 1632, 30, 151645, 198, 151644, 77091, 198],
    list(range(40000, 40061, 3)),
]
NEW_TOKENS = 32


def hf_model(path):  # noqa: ANN001, ANN201
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_greedy(model, prompt: list[int]) -> list[int]:  # noqa: ANN001
    with torch.no_grad():
        # An explicit mask: inferring one from pad_token_id would mask real tokens.
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=151643,
        )
    return out[0, len(prompt) :].tolist()


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


VARIANTS = [
    ("qwen3_moe", {}),
    # dense MLP layers two ways, and un-normalised top-k weights
    ("qwen3_moe", {"mlp_only_layers": [0], "decoder_sparse_step": 1, "norm_topk_prob": False}),
    ("qwen3_moe", {"decoder_sparse_step": 2, "norm_topk_prob": True}),
    ("olmoe", {}),
    ("mixtral", {}),
]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: v[0] + "".join(f"-{k}" for k in v[1]))
def pair(request, make_ckpt):  # noqa: ANN001, ANN201
    model_type, overrides = request.param
    path = make_ckpt(model_type, **overrides)
    ref = hf_model(path)
    expected = [hf_greedy(ref, p) for p in PROMPTS]
    return path, ref, expected


def test_greedy_batch_and_alone_match_transformers(pair) -> None:  # noqa: ANN001
    path, _, expected = pair
    with LLM(str(path), dtype="float32") as llm:
        batch = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        alone = [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    assert batch == expected
    assert alone == expected
    assert all(len(set(t)) > 4 for t in expected), "degenerate reference output: weak test"


def test_logits_match_transformers_at_every_position(pair) -> None:  # noqa: ANN001
    path, ref, expected = pair
    with LLM(str(path), dtype="float32", max_prefill_tokens=4096) as llm:
        for prompt, generated in zip(PROMPTS, expected, strict=True):
            seq = prompt + generated
            ours = llm.prompt_logits(seq)
            with torch.no_grad():
                theirs = ref(torch.tensor([seq])).logits[0].float()
            assert ours.shape == theirs.shape
            # longest reduction: hidden 64 (contexts reach 55 tokens; experts and heads are narrower)
            atol = network_atol(torch.float32, max(64, len(seq)), theirs.abs().max().item())
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def default_tokens(qwen3_ckpt) -> list[list[int]]:  # noqa: ANN001
    """The default engine's greedy tokens: one run, shared by every chunking and page size."""
    with LLM(str(qwen3_ckpt), dtype="float32") as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("max_prefill_tokens", [7, 4096])
def test_chunking_and_page_size_do_not_change_tokens(qwen3_ckpt, default_tokens, page_size,  # noqa: ANN001
                                                     max_prefill_tokens) -> None:
    with LLM(
        str(qwen3_ckpt), dtype="float32", page_size=page_size, max_prefill_tokens=max_prefill_tokens
    ) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert got == default_tokens
