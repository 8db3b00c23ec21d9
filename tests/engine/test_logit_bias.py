"""`logit_bias`: the sampler against a plain torch reference (the bias added to the logits
as a dense [B, V] tensor, then the unchanged pipeline), the device rows against the
host-side batch, the limits, and the whole engine (greedy, seeded, preemption).

NOTE on exact comparisons: the sampler adds a row's bias to the float32 copy of the
logits once (one rounding, as the reference's dense add does; its padding adds 0.0,
which is exact), so everything after the bias sees bit-identical inputs.
"""

from __future__ import annotations

import dataclasses
import random

import msgspec
import pytest
import torch
from tolerances import log_softmax_atol
from torch import Tensor

from edgemoe import LLM
from edgemoe.engine.request import Request
from edgemoe.engine.sampler import (
    SamplingBatch,
    SamplingState,
    apply_filters,
    apply_penalties,
    request_seed,
    sample,
)
from edgemoe.engine.sampling import SamplingRows
from edgemoe.messages import AddRequest, EngineRequest, SamplingParams

V = 64
EOS = frozenset({3})


def dense_bias(params: list[SamplingParams], vocab: int) -> Tensor:
    """The reference: every row's bias as a plain [B, V] float32 tensor, written a token at a time."""
    out = torch.zeros(len(params), vocab, dtype=torch.float32)
    for row, p in enumerate(params):
        for token, value in (p.logit_bias or {}).items():
            out[row, token] = value
    return out


def unbiased(p: SamplingParams) -> SamplingParams:
    return msgspec.structs.replace(p, logit_bias=None)


def states_for(params: list[SamplingParams], outputs: list[list[int]], seeds: list[int]) -> list[SamplingState]:
    states = []
    for p, out, seed in zip(params, outputs, seeds, strict=True):
        state = SamplingState(p, prompt_ids=[1, 2, 5], eos_ids=EOS, output_ids=list(out))
        state.seed = seed
        states.append(state)
    return states


def random_bias(rng: random.Random) -> dict[int, float] | None:
    if rng.random() < 0.4:
        return None
    size = rng.choice([1, 3, 20])
    return {t: rng.choice([-100.0, 100.0, rng.uniform(-5, 5)]) for t in rng.sample(range(V), size)}


def random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.0, 0.0, 0.8, 1.5]), top_k=rng.choice([0, 8]), top_p=rng.choice([1.0, 0.9]),
        min_p=rng.choice([0.0, 0.05]), repetition_penalty=rng.choice([1.0, 1.3]),
        frequency_penalty=rng.choice([0.0, 0.7]), presence_penalty=rng.choice([0.0, -0.5]),
        min_tokens=rng.choice([0, 4]), stop_token_ids=rng.choice([[], [9]]), logprobs=rng.choice([None, 0, 3]),
        seed=rng.randrange(1 << 40), logit_bias=random_bias(rng),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampler_adds_each_rows_bias_before_the_whole_pipeline(dtype: torch.dtype) -> None:
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    for trial in range(40):
        params = [random_params(rng) for _ in range(rng.randrange(1, 7))]
        outputs = [[rng.randrange(V) for _ in range(rng.randrange(0, 6))] for _ in params]
        seeds = [request_seed(p, rng) for p in params]
        logits = (torch.randn(len(params), V, generator=g) * 4).to(dtype)
        batch = SamplingBatch.build(states_for(params, outputs, seeds), V, "cpu")
        ref_logits = logits.float() + dense_bias(params, V)
        ref_batch = SamplingBatch.build(states_for([unbiased(p) for p in params], outputs, seeds), V, "cpu")
        x, ref_x = apply_penalties(logits.float().clone(), batch), apply_penalties(ref_logits.clone(), ref_batch)
        assert torch.equal(x, ref_x), trial  # the bias came first: penalties saw the biased logits
        assert torch.equal(apply_filters(x, batch), apply_filters(ref_x, ref_batch)), trial
        got, want = sample(logits, batch), sample(ref_logits, ref_batch)
        assert torch.equal(got.token_ids, want.token_ids), trial
        if got.logprobs is not None:  # the raw model distribution, bias or not
            raw = torch.log_softmax(logits.double(), -1).gather(1, got.token_ids[:, None]).squeeze(1)
            for b in range(len(params)):
                tol = log_softmax_atol(torch.float32, V, abs(float(raw[b])))
                assert float(got.logprobs[b]) == pytest.approx(float(raw[b]), abs=tol)


def test_plus_100_forces_and_minus_100_bans_a_greedy_token() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, V, generator=g) * 3  # |logit| far below 100: the bias decides
    best = logits.double().argmax(-1)
    params = [
        SamplingParams(temperature=0.0, logit_bias={17: 100.0}),
        SamplingParams(temperature=0.0, logit_bias={int(best[1]): -100.0}),
        SamplingParams(temperature=0.0),  # a row without a bias in the same batch
        SamplingParams(temperature=0.9, seed=5, logit_bias={int(t): -100.0 for t in range(V) if t != 40}),
    ]
    out = sample(logits, SamplingBatch.build(states_for(params, [[]] * 4, [0, 0, 0, 5]), V, "cpu"))
    second = logits[1].double().clone()
    second[best[1]] = float("-inf")
    assert out.token_ids.tolist() == [17, int(second.argmax()), int(best[2]), 40]


def test_min_tokens_still_bans_eos_that_a_bias_favours() -> None:
    logits = torch.zeros(1, V)
    p = SamplingParams(temperature=0.0, min_tokens=2, logit_bias={3: 100.0, 8: 1.0})
    x = apply_penalties(logits.clone(), SamplingBatch.build(states_for([p], [[]], [0]), V, "cpu"))
    assert x[0, 3] == float("-inf") and x[0, 8] == 1.0
    assert sample(logits, SamplingBatch.build(states_for([p], [[5, 6]], [0]), V, "cpu")).token_ids.tolist() == [3]


def test_a_batch_without_bias_carries_none() -> None:
    batch = SamplingBatch.build(states_for([SamplingParams(), SamplingParams(logit_bias={})], [[], []], [1, 2]),
                                V, "cpu")
    assert batch.logit_bias is None


# ---- device rows -----------------------------------------------------------------------


def effect(batch: SamplingBatch) -> Tensor:
    """What a batch's bias adds to zero logits, [B, V] (layouts may differ, effects may not)."""
    return apply_penalties(torch.zeros(len(batch.greedy_rows), V), bias_only(batch))


def bias_only(batch: SamplingBatch) -> SamplingBatch:
    """The batch with only its bias left (penalties and bans off), so `effect` is the bias alone."""
    return dataclasses.replace(batch, banned=None, seen=None, repetition=None, output_counts=None,
                               frequency=None, presence=None)


def test_rows_match_the_host_batch_through_reuse_and_readmission() -> None:
    rng = random.Random(4)
    rows = SamplingRows(num_rows=5, vocab_size=V, device=torch.device("cpu"), seed=3)
    free, live = list(range(5)), []
    for step in range(80):
        if free and (not live or rng.random() < 0.4):
            req = Request(f"r{step}", [1, 2], random_params(rng))
            req.output_ids = [rng.randrange(V) for _ in range(rng.randrange(0, 3))]
            req.row = free.pop(rng.randrange(len(free)))
            rows.assign(req, EOS)
            live.append(req)
        if live and rng.random() < 0.2:  # preempted, re-admitted into another free row
            req = live[rng.randrange(len(live))]
            if free:
                old, req.row = req.row, free.pop()
                free.append(old)
                rows.release(old)
                rows.assign(req, EOS)
        order = rng.sample(live, len(live))
        ids = tuple(r.row for r in order)
        got = rows.batch(ids, torch.tensor(ids, dtype=torch.int32), tuple(len(r.output_ids) for r in order))
        states = [SamplingState(r.params, eos_ids=EOS) for r in order]
        want = SamplingBatch.build(states, V, "cpu")
        assert (got.logit_bias is None) == (want.logit_bias is None), step
        if got.logit_bias is not None:
            assert torch.equal(effect(got), effect(want)), step
            assert torch.equal(effect(want), dense_bias([r.params for r in order], V)), step
        if live and rng.random() < 0.3:
            done = live.pop(rng.randrange(len(live)))
            rows.release(done.row)
            free.append(done.row)


def test_unbiased_requests_cost_nothing_and_reused_rows_do_not_leak() -> None:
    rows = SamplingRows(num_rows=3, vocab_size=V, device=torch.device("cpu"), seed=0)
    plain = Request("plain", [1], SamplingParams(temperature=0.0))
    plain.row = 0
    rows.assign(plain, EOS)
    assert rows.bias_ids is None and rows.bias_values is None  # nothing allocated, nothing written
    assert rows.plain_greedy((0,), (0,))
    biased = Request("biased", [1], SamplingParams(temperature=0.0, logit_bias={7: 50.0, 9: -3.0}))
    biased.row = 1
    rows.assign(biased, EOS)
    assert not rows.plain_greedy((1,), (0,)) and not rows.plain_greedy((0, 1), (0, 0))
    assert rows.batch((0,), torch.tensor([0]), (0,)).logit_bias is None  # only rows that have one pay
    rows.release(1)
    after = Request("after", [1], SamplingParams(temperature=0.0))  # takes the biased row
    after.row = 1
    rows.assign(after, EOS)
    other = Request("other", [1], SamplingParams(temperature=0.0, logit_bias={2: 1.0}))
    other.row = 2
    rows.assign(other, EOS)
    got = rows.batch((1, 2), torch.tensor([1, 2]), (0, 0))
    want = torch.zeros(2, V)
    want[1, 2] = 1.0
    assert torch.equal(effect(got), want)


def test_limits_and_the_vocabulary() -> None:
    SamplingParams(logit_bias={0: -100, V - 1: 100.0}).validate(V)
    bad = [
        ({V: 1.0}, "outside the vocabulary"), ({-1: 1.0}, "token ids"), ({True: 1.0}, "token ids"),
        ({"5": 1.0}, "token ids"), ({1: 100.5}, "between -100 and 100"), ({1: float("nan")}, "between"),
        ({1: float("inf")}, "between"), ({1: True}, "between"), ({1: 10**400}, "between"),
        ({t: 1.0 for t in range(301)}, "at most 300"),
    ]
    for bias, match in bad:
        with pytest.raises(ValueError, match=match) as info:
            SamplingParams(logit_bias=bias).validate(V)  # type: ignore[arg-type]
        assert str(info.value).startswith("logit_bias ")
    SamplingParams(logit_bias={t: 1.0 for t in range(300)}).validate(V + 300)


def test_the_bias_crosses_the_process_boundary() -> None:
    sent = AddRequest(request_id="a", prompt_ids=[1], params=SamplingParams(logit_bias={12: -100.0, 151000: 2.5}))
    got = msgspec.msgpack.Decoder(EngineRequest).decode(msgspec.msgpack.Encoder().encode(sent))
    assert isinstance(got, AddRequest) and got.params.logit_bias == {12: -100.0, 151000: 2.5}


# ---- the engine ----------------------------------------------------------------------------

PROMPTS = [list(range(5000 + 40 * i, 5000 + 40 * i + 20)) for i in range(4)]


def engine_params(first: list[int]) -> list[SamplingParams]:
    """Per prompt: forced token, banned greedy first token, no bias, seeded with a ban."""
    return [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logit_bias={1234: 100.0}),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logit_bias={first[1]: -100.0}),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=11, max_tokens=24, ignore_eos=True, logit_bias={first[3]: -100.0}),
    ]


def test_the_engine_applies_biases_per_request_and_keeps_them_through_preemption(qwen3_ckpt) -> None:  # noqa: ANN001
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(str(qwen3_ckpt), dtype="float32") as roomy:
        unbiased_out = [o.token_ids for o in roomy.generate(PROMPTS, plain)]
        seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=24, ignore_eos=True)
        first = [o[0] for o in unbiased_out[:3]] + [roomy.generate(PROMPTS[3:], seeded)[0].token_ids[0]]
        want = [o.token_ids for o in roomy.generate(PROMPTS, engine_params(first))]
        with pytest.raises(ValueError, match="logit_bias"):
            roomy.generate(PROMPTS[:1], SamplingParams(logit_bias={roomy.engine.vocab_size: 1.0}))
    assert want[0] == [1234] * 24
    assert want[1][0] != first[1] and first[1] not in want[1]
    assert want[2] == unbiased_out[2]  # its batch neighbours' biases never reach it
    assert first[3] not in want[3]
    # 64 tokens of KV for four 44-token sequences: requests are preempted and recomputed.
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=64, page_size=4) as tight:
        got = [o.token_ids for o in tight.generate(PROMPTS, engine_params(first))]
    assert got == want
