"""Sampling state in device rows against the host-side reference (`SamplingBatch.build`
from `SamplingState`s): after any sequence of admissions, draws, row reuse and
re-admission after preemption, the gathered batch equals the reference batch."""

from __future__ import annotations

import random

import torch

from edgemoe.engine.request import Request
from edgemoe.engine.sampler import SamplingBatch, SamplingState, sample
from edgemoe.engine.sampling import SamplingRows, greedy_tokens
from edgemoe.messages import SamplingParams

V = 50
EOS = frozenset({3, 7})


def random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.0, 0.7, 1.3]),
        top_k=rng.choice([0, 5, 60]),
        top_p=rng.choice([1.0, 0.8]),
        min_p=rng.choice([0.0, 0.1]),
        repetition_penalty=rng.choice([1.0, 1.2]),
        frequency_penalty=rng.choice([0.0, 0.5]),
        presence_penalty=rng.choice([0.0, -0.3]),
        min_tokens=rng.choice([0, 2, 5]),
        ignore_eos=rng.random() < 0.3,
        stop_token_ids=rng.choice([[], [11], [11, 12]]),
        seed=rng.choice([None, rng.randrange(1 << 40)]),
        max_tokens=100,
    )


def reference_state(req: Request) -> SamplingState:
    eos = frozenset() if req.params.ignore_eos else EOS
    state = SamplingState(req.params, prompt_ids=req.prompt_ids, eos_ids=eos, output_ids=list(req.output_ids))
    state.seed = req.seed  # the engine drew it (or took the request's own)
    return state


def assert_same(got: SamplingBatch, want: SamplingBatch, order: list[Request]) -> None:
    for name in ("temperature", "greedy", "top_k", "top_p", "min_p", "repetition", "frequency",
                 "presence", "seeds", "counters"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), name
    # Penalty state is compared where the row uses it: elsewhere the neutral parameter
    # (repetition 1, frequency/presence 0) makes whatever the row holds irrelevant.
    use_rep = torch.tensor([r.params.repetition_penalty != 1.0 for r in order])[:, None]
    use_freq = torch.tensor([r.params.frequency_penalty != 0.0 or r.params.presence_penalty != 0.0 for r in order])[:, None]
    for name, use in (("seen", use_rep), ("output_counts", use_freq)):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(torch.where(use, a, 0).to(b.dtype), b), name
    assert got.greedy_rows == want.greedy_rows and got.max_top_k == want.max_top_k
    assert got.num_logprobs == want.num_logprobs
    pairs = lambda b: set() if b is None else set(zip(b.rows.tolist(), b.ids.tolist(), strict=True))  # noqa: E731
    assert pairs(got.banned) == pairs(want.banned)


def test_rows_track_the_reference_through_draws_reuse_and_preemption() -> None:
    rng = random.Random(0)
    rows = SamplingRows(num_rows=6, vocab_size=V, device=torch.device("cpu"), seed=5)
    free, live = list(range(6)), []
    for step in range(60):
        if free and (not live or rng.random() < 0.3):  # admit (or re-admit a preempted one)
            prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 9))]
            req = Request(f"r{step}", prompt, random_params(rng))
            req.output_ids = [rng.randrange(V) for _ in range(rng.randrange(0, 3))]  # as after preemption
            req.row = free.pop()
            rows.assign(req, EOS)
            live.append(req)
        order = rng.sample(live, len(live))  # batch position must not matter
        row_ids = tuple(r.row for r in order)
        got = rows.batch(row_ids, torch.tensor(row_ids, dtype=torch.int32), tuple(len(r.output_ids) for r in order))
        assert_same(got, SamplingBatch.build([reference_state(r) for r in order], V, "cpu"), order)
        tokens = torch.tensor([rng.randrange(V) for _ in order])
        rows.update(torch.tensor(row_ids, dtype=torch.int32), tokens, got)
        for r, t in zip(order, tokens.tolist(), strict=True):
            r.output_ids.append(t)
        if live and rng.random() < 0.25:  # finish one; its row is reused later
            done = live.pop(rng.randrange(len(live)))
            rows.release(done.row)
            free.append(done.row)


def test_an_unseeded_request_keeps_its_drawn_seed_across_readmission() -> None:
    rows = SamplingRows(num_rows=2, vocab_size=V, device=torch.device("cpu"), seed=1)
    req = Request("a", [1, 2], SamplingParams(temperature=1.0))
    req.row = 0
    rows.assign(req, EOS)
    seed = req.seed
    req.row = 1  # preempted and re-admitted into another row
    rows.assign(req, EOS)
    assert req.seed == seed and int(rows.seeds[1]) == seed


def test_plain_greedy_steps_take_the_argmax_sample_would() -> None:
    """`plain_greedy` holds exactly when the reference batch has nothing but greedy rows
    without penalties, bans or logprobs; then `greedy_tokens` is `sample`'s answer (ties,
    rows of -inf and NaN included)."""
    rng = random.Random(3)
    rows = SamplingRows(num_rows=4, vocab_size=V, device=torch.device("cpu"), seed=2)
    g = torch.Generator().manual_seed(4)
    plain_seen = mixed_seen = 0
    for step in range(80):
        params = random_params(rng)
        if rng.random() < 0.6:  # plain greedy more often than random_params would make it
            params = SamplingParams(temperature=0.0, min_tokens=rng.choice([0, 3]), max_tokens=100,
                                    stop_token_ids=rng.choice([[], [11], [V + 5]]), ignore_eos=rng.random() < 0.5)
        req = Request(f"r{step}", [1, 2], params)
        req.output_ids = [5] * rng.randrange(0, 5)
        req.row = step % 4
        rows.assign(req, EOS)
        state = reference_state(req)
        want_plain = (state.params.temperature < 1e-5 and not [t for t in state.banned_ids() if 0 <= t < V]
                      and params.logprobs is None and params.repetition_penalty == 1.0
                      and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0)
        got_plain = rows.plain_greedy((req.row,), (len(req.output_ids),))
        assert got_plain == want_plain, params
        if got_plain:
            logits = torch.randn(1, V, generator=g)
            pick = rng.randrange(4)
            if pick == 0:
                logits[0, 7] = logits[0, 9] = logits.max() + 1  # a tie: the lower id
            elif pick == 1:
                logits.fill_(float("-inf"))
            elif pick == 2:
                logits[0, 13] = float("nan")
            batch = SamplingBatch.build([state], V, "cpu")
            assert torch.equal(greedy_tokens(logits).token_ids, sample(logits, batch).token_ids)
            plain_seen += 1
        else:
            mixed_seen += 1
    assert plain_seen > 10 and mixed_seen > 10  # both branches exercised
