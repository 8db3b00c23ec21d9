"""The prefix cache is invisible in the tokens: a hit gives the cold run's tokens, at
page sizes 1 and 16, also after the cached pages were evicted and recomputed."""

from __future__ import annotations

import pytest

from edgemoe import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SYSTEM = list(range(7000, 7045))  # a shared "system prompt" of 45 tokens
TURN_A = SYSTEM + [11, 12, 13, 14, 15]
TURN_B = SYSTEM + [21, 22, 23]


@pytest.fixture(scope="module")
def cold(qwen3_ckpt):  # noqa: ANN001, ANN201
    with LLM(str(qwen3_ckpt), dtype="float32", cache_type="none") as llm:
        return {tuple(p): llm.generate([p], GREEDY)[0].token_ids for p in (TURN_A, TURN_B)}


@pytest.mark.parametrize("page_size", [1, 16])
def test_hits_give_cold_tokens(qwen3_ckpt, cold, page_size: int) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=page_size) as llm:
        first = llm.generate([TURN_A], GREEDY)[0]
        assert first.num_cached_tokens == 0 and first.token_ids == cold[tuple(TURN_A)]
        again = llm.generate([TURN_A], GREEDY)[0]
        assert again.token_ids == cold[tuple(TURN_A)]
        # Everything but the last prompt token can come from the cache, in whole pages.
        assert again.num_cached_tokens == (len(TURN_A) - 1) // page_size * page_size
        other = llm.generate([TURN_B], GREEDY)[0]
        assert other.token_ids == cold[tuple(TURN_B)]
        assert other.num_cached_tokens == len(SYSTEM) // page_size * page_size
        # The next agent turn: the whole previous conversation is a prefix.
        turn2 = TURN_A + first.token_ids + [31, 32]
        nxt = llm.generate([turn2], GREEDY)[0]
        assert nxt.num_cached_tokens >= (len(TURN_A) + len(first.token_ids) - 1) // page_size * page_size
        stats = llm.stats()["prefix_cache"]
        assert stats["queries"] == 4 and stats["hit_tokens"] > 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_evicted_prefix_is_recomputed_identically(qwen3_ckpt, cold, page_size: int) -> None:  # noqa: ANN001
    # 96 tokens of KV: the 50-token turn plus a 60-token filler cannot both stay cached.
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=page_size, kv_tokens=96) as llm:
        assert llm.generate([TURN_A], GREEDY)[0].token_ids == cold[tuple(TURN_A)]
        llm.generate([list(range(9000, 9060))], GREEDY)  # evicts TURN_A's pages
        again = llm.generate([TURN_A], GREEDY)[0]
        assert again.num_cached_tokens < len(TURN_A) - page_size
        assert again.token_ids == cold[tuple(TURN_A)]
        pool = llm.engine.runtime.pool
        assert pool.num_free + llm.engine.prefix_cache.total_pages == pool.num_pages


def test_concurrent_requests_share_prefix_pages(qwen3_ckpt, cold) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4) as llm:
        llm.generate([SYSTEM + [1]], SamplingParams(temperature=0, max_tokens=1))
        outs = llm.generate([TURN_A, TURN_B], GREEDY)
        assert [o.token_ids for o in outs] == [cold[tuple(TURN_A)], cold[tuple(TURN_B)]]
        assert all(o.num_cached_tokens == 44 for o in outs)  # 45 shared tokens → 11 pages


@pytest.mark.parametrize("page_size", [1, 16])
def test_host_tier_brings_evicted_pages_back(qwen3_ckpt, cold, page_size: int) -> None:  # noqa: ANN001
    """A plain attention model with --host-cache: the evicted turn comes back from host
    memory (a hit, not a recompute) and gives the cold run's tokens."""
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=page_size, kv_tokens=96, host_cache="8MiB") as llm:
        assert llm.generate([TURN_A], GREEDY)[0].token_ids == cold[tuple(TURN_A)]
        llm.generate([list(range(9000, 9060))], GREEDY)  # evicts TURN_A's pages to the host tier
        again = llm.generate([TURN_A], GREEDY)[0]
        assert again.num_cached_tokens == (len(TURN_A) - 1) // page_size * page_size
        assert again.token_ids == cold[tuple(TURN_A)]
        pool = llm.engine.runtime.pool
        assert pool.num_free + llm.engine.prefix_cache.total_pages == pool.num_pages


def test_host_tier_needs_the_prefix_cache(qwen3_ckpt) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=r"host_cache \(--host-cache\) needs the prefix cache"):
        LLM(str(qwen3_ckpt), dtype="float32", cache_type="none", host_cache="8MiB")
