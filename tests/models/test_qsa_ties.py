"""QSA's block top-k breaks equal scores to the lower block id, whatever the scores'
width: blocks whose every indexer head scores <= 0 tie at exactly 0, torch's top-k takes
any of them and which depends on the width (in decode, the page table's capacity), so a
request's tokens changed with --kv-tokens on the tiny Qwen3.8-Flash-Next (a prefix-cache
campaign's find, 2026-12-05)."""

from __future__ import annotations

import torch

from edgemoe import LLM, SamplingParams

# The campaign's prompt: its decode steps cut QSA's top-k inside a run of zero scores.
PROMPT = [3545, 431, 2221, 4288, 4080, 3457, 4762, 4266, 2651, 3025, 87215, 3624, 114176, 1752, 1074, 4172, 3360,
          2201, 1797]


def test_equal_scores_go_to_the_lower_block_at_any_width() -> None:
    from edgemoe.kernels.qsa import ranked, top_blocks

    for width in (5, 6, 8, 16, 40, 1000):
        scores = torch.zeros(2, width)
        scores[:, 3] = 0.5
        scores[1, 2] = -0.0  # relu's zeros may carry a sign: still a tie with the others
        scores[:, 5:] = -1.0  # unseen: below every seen block
        top, valid = top_blocks(scores, torch.tensor([5, 5]), 4)
        assert top.tolist() == [[3, 0, 1, 2], [3, 0, 1, 2]] and bool(valid.all())
    keys = ranked(torch.tensor([[0.25, 1.0, -1.0, 0.25, 0.0]]))
    assert keys.argsort(descending=True).tolist() == [[1, 0, 3, 4, 2]]


def test_tokens_do_not_depend_on_the_kv_capacity() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    seen = set()
    for kv in (40, 48, 4096):  # the prompt and its 8 tokens fit each
        with LLM("random:tiny-qwen3.8-flash-next", dtype="float32", cache_type="none", page_size=1,
                 kv_tokens=kv) as llm:
            seen.add(tuple(llm.generate([PROMPT], params)[0].token_ids))
    assert len(seen) == 1
