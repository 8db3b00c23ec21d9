"""`logit_bias` on the GPU engine (CUDA graphs, overlap on: the GPU defaults): the bias
rows are device tensors written at admission, so a biased request beside unbiased ones
in one decode batch must change its own tokens only, and a row reused after a biased
request must not keep its bias."""

from __future__ import annotations

from edgemoe import LLM, SamplingParams

PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
PLAIN = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def generate(llm: LLM, params: list[SamplingParams]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_a_biased_row_beside_unbiased_ones(small_ckpt) -> None:  # noqa: ANN001
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="resident") as llm:
        assert llm.engine.runner.graphs is not None and llm.engine.overlap is not None
        plain = generate(llm, [PLAIN] * 3)
        banned = plain[1][0]  # the middle request's first greedy token, banned from it alone
        forced = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logit_bias={77: 100.0})
        ban = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logit_bias={banned: -100.0})
        got = generate(llm, [forced, ban, PLAIN])
        assert got[0] == [77] * 24
        assert banned not in got[1] and got[1] != plain[1]
        assert got[2] == plain[2]  # its neighbours' bias rows add nothing to it
        assert generate(llm, [PLAIN] * 3) == plain  # the rows that held a bias hold none now


def test_a_bias_on_the_device_cache(small_ckpt) -> None:  # noqa: ANN001
    """The same through the device expert cache, 8 slots for 4 layers of 16 experts (misses
    every step, waves in a batch of 3): the bias is applied after the layers, whatever moved
    the experts."""
    with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=8) as llm:
        plain = generate(llm, [PLAIN] * 3)
        forced = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logit_bias={123: 100.0})
        got = generate(llm, [PLAIN, forced, PLAIN])
        assert got[1] == [123] * 24 and got[0] == plain[0] and got[2] == plain[2]
