"""The batched sampler against plain per-row references and sampling statistics.

References are written independently here: Python loops over one row at a time in
float64 (top-k by sorted value, top-p by descending cumulative mass, min-p by ratio to
the best, penalties token by token), and `torch.log_softmax` for logprobs.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from tolerances import log_softmax_atol, rounding_atol, sum_atol
from torch import Tensor

from edgemoe.engine.sampler import (
    SampleOutput,
    SamplingBatch,
    SamplingState,
    apply_filters,
    apply_penalties,
    counter_exponential,
    request_seed,
    sample,
)
from edgemoe.messages import SamplingParams

INF = float("inf")


def make_states(
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]] | None = None,
    outputs: Sequence[Sequence[int]] | None = None,
    eos: frozenset[int] = frozenset(),
) -> list[SamplingState]:
    states = []
    for i, p in enumerate(params):
        s = SamplingState(p, prompt_ids=prompts[i] if prompts else (), eos_ids=eos)
        for t in outputs[i] if outputs else ():
            s.append(t)
        states.append(s)
    return states


def run(logits: Tensor, states: Sequence[SamplingState], seed: int | None = None) -> SampleOutput:
    """Sample once; unseeded states get seeds drawn from `seed`, as the engine does; a
    state's draw counter is its number of outputs, so repeated runs draw afresh."""
    rng = random.Random(seed)
    for s in states:
        if s.params.seed is None and seed is not None:
            s.seed = request_seed(s.params, rng)
    batch = SamplingBatch.build(states, logits.shape[1], logits.device)
    return sample(logits, batch)


# ---- per-row references -------------------------------------------------------------


def ref_penalties(
    row: list[float], prompt: Sequence[int], output: Sequence[int], p: SamplingParams
) -> list[float]:
    out = list(row)
    for t in set(prompt) | set(output):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t, n in Counter(output).items():
        out[t] -= p.frequency_penalty * n + p.presence_penalty
    return out


def ref_top_k(row: list[float], k: int) -> set[int]:
    if k <= 0 or k >= len(row):
        return set(range(len(row)))
    kth = sorted(row, reverse=True)[k - 1]
    return {i for i, v in enumerate(row) if v >= kth}


def softmax64(row: Sequence[float], keep: set[int]) -> dict[int, float]:
    top = max(row[i] for i in keep)
    w = {i: math.exp(row[i] - top) for i in keep if row[i] > -INF}
    z = sum(w.values())
    return {i: v / z for i, v in w.items()}


def ref_top_p(row: list[float], keep: set[int], p: float) -> tuple[set[int], set[int]]:
    """Kept set, plus tokens whose fate is decided within rounding of the p boundary."""
    probs = softmax64(row, keep)
    order = sorted(probs, key=lambda i: -probs[i])
    kept, unsure, above = set(), set(), 0.0
    # float32 softmax (a sum of len(row) probabilities) then its cumulative sum (as many)
    width = 2 * sum_atol(torch.float32, len(row), 1.0)
    for rank, i in enumerate(order):
        if above < p or rank == 0:
            kept.add(i)
        if abs(above - p) < width:
            unsure.add(i)
        above += probs[i]
    return kept, unsure


def ref_min_p(row: list[float], keep: set[int], m: float) -> set[int]:
    probs = softmax64(row, keep)
    best = max(probs.values())
    return {i for i, q in probs.items() if q >= m * best}


def ref_distribution(row: list[float], p: SamplingParams) -> dict[int, float]:
    """softmax(logits / T) restricted by top-k, then top-p, then min-p (float64)."""
    scaled = [v / p.temperature for v in row]
    keep = ref_top_k(scaled, p.top_k)
    if p.top_p < 1.0:
        keep, _ = ref_top_p(scaled, keep, p.top_p)
    if p.min_p > 0.0:
        keep = ref_min_p(scaled, keep, p.min_p)
    return softmax64(scaled, keep)


def kept(x: Tensor) -> set[int]:
    return {int(i) for i in torch.nonzero(x > -INF).flatten()}


# ---- processors vs references -------------------------------------------------------


def random_ids(V: int, max_len: int, g: torch.Generator) -> list[int]:
    n = int(torch.randint(0, max_len, (1,), generator=g))
    return torch.randint(0, V, (n,), generator=g).tolist()


def test_penalties_match_reference() -> None:
    g = torch.Generator().manual_seed(0)
    V, B = 40, 8
    logits = torch.randn(B, V, generator=g) * 3
    params, prompts, outputs = [], [], []
    for i in range(B):
        params.append(
            SamplingParams(
                repetition_penalty=[1.0, 1.3, 0.7, 2.0][i % 4],
                frequency_penalty=[0.0, 0.5, -0.4, 1.2][(i // 2) % 4],
                presence_penalty=[0.0, 1.0, -1.5][i % 3],
            )
        )
        prompts.append(random_ids(V, 20, g))
        outputs.append(random_ids(V, 30, g))
    states = make_states(params, prompts, outputs)
    got = apply_penalties(logits.clone(), SamplingBatch.build(states, V, "cpu"))
    for i in range(B):
        want = ref_penalties(logits[i].tolist(), prompts[i], outputs[i], params[i])
        p, n = params[i], max(Counter(outputs[i]).values(), default=0)
        largest = logits[i].abs().max().item() / min(p.repetition_penalty, 1 / p.repetition_penalty)
        largest += abs(p.frequency_penalty) * n + abs(p.presence_penalty)
        # 3 penalties rounded to float32, ÷ or ×, frequency × count, + presence, −, and the
        # reference's cast: 8 roundings, none of a value larger than `largest`
        torch.testing.assert_close(got[i], torch.tensor(want), rtol=0, atol=rounding_atol(torch.float32, 8, largest))


@pytest.mark.parametrize("use_top_p", [True, False])  # False: the topk (no sort) path
@pytest.mark.parametrize("seed", range(6))
def test_filters_match_reference(seed: int, use_top_p: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    V, B = 64, 12
    logits = torch.randn(B, V, generator=g) * (1 + seed)
    logits[1, : V // 2] = -INF  # a -inf prefix
    params = [
        SamplingParams(
            temperature=float(torch.empty(1).uniform_(0.3, 1.5, generator=g)),
            top_k=[0, -1, 1, 5, 20, V + 7][(i + seed) % 6],
            top_p=[1.0, 0.9, 0.5, 0.05, 0.999][(i * 3 + seed) % 5] if use_top_p else 1.0,
            min_p=[0.0, 0.05, 0.3, 1.0][(i + 2 * seed) % 4],
        )
        for i in range(B)
    ]
    got = apply_filters(logits.clone(), SamplingBatch.build(make_states(params), V, "cpu"))
    for i, p in enumerate(params):
        row = [v / p.temperature for v in logits[i].tolist()]
        keep = ref_top_k(row, p.top_k)
        unsure: set[int] = set()
        if p.top_p < 1.0:
            keep, unsure = ref_top_p(row, keep, p.top_p)
        want = ref_min_p(row, keep, p.min_p) if p.min_p > 0 else keep
        assert kept(got[i]) ^ want <= unsure, (i, p)
        survivors = sorted(kept(got[i]))
        # temperature rounded to float32, the division, the reference's cast: 3 roundings, relative
        rtol = rounding_atol(torch.float32, 3, 1.0)
        torch.testing.assert_close(got[i, survivors], torch.tensor([row[j] for j in survivors]), rtol=rtol, atol=0)


def test_top_k_keeps_ties_with_kth_value() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    batch = SamplingBatch.build(make_states([SamplingParams(top_k=2)]), 5, "cpu")
    got = apply_filters(logits, batch)
    assert kept(got[0]) == {1, 2, 3}


# ---- greedy, seeds, distributions ---------------------------------------------------


def test_greedy_rows_take_the_argmax_in_a_mixed_batch() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 100, generator=g)
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0, top_k=3) for i in range(6)]
    for step in range(5):
        out = run(logits, make_states(params), seed=step)
        assert torch.equal(out.token_ids[::2], logits[::2].argmax(-1))


def test_greedy_after_penalties() -> None:
    logits = torch.tensor([[5.0, 4.0, 1.0]])
    p = SamplingParams(temperature=0.0, presence_penalty=2.0)
    assert run(logits, make_states([p], outputs=[[0]])).token_ids.item() == 1


def seeded_tokens(
    logits_row: Tensor, seed: int, others: int, position: int, steps: int
) -> list[int]:
    """Sample `steps` tokens for one seeded request placed among `others` random rows."""
    g = torch.Generator().manual_seed(1000 + others)
    mine = SamplingState(SamplingParams(seed=seed, top_p=0.95))
    got = []
    for _ in range(steps):
        rows = [torch.randn(logits_row.shape[0], generator=g) for _ in range(others)]
        rows.insert(position, logits_row)
        seeds = torch.randint(0, 99, (others,), generator=g).tolist()
        params = [SamplingParams(temperature=0.8, seed=s) for s in seeds]
        states = make_states(params)
        states.insert(position, mine)
        out = run(torch.stack(rows), states, seed=others)
        got.append(int(out.token_ids[position]))
        mine.append(got[-1])  # as the engine does: the next draw uses the next counter
    return got


def test_seeded_sampling_is_independent_of_batch_composition() -> None:
    row = torch.randn(500, generator=torch.Generator().manual_seed(3))
    alone = seeded_tokens(row, seed=42, others=0, position=0, steps=10)
    assert seeded_tokens(row, seed=42, others=3, position=2, steps=10) == alone
    assert seeded_tokens(row, seed=42, others=7, position=7, steps=10) == alone
    assert len(set(alone)) > 1  # it really samples


def test_different_seeds_give_different_samples() -> None:
    logits = torch.zeros(30, 1000)
    out = run(logits, make_states([SamplingParams(seed=s) for s in range(30)]))
    assert len(set(out.token_ids.tolist())) > 20


def test_unseeded_rows_follow_the_engine_generator() -> None:
    logits = torch.zeros(4, 1000)
    params = [SamplingParams()] * 4
    a = run(logits, make_states(params), seed=5).token_ids
    b = run(logits, make_states(params), seed=5).token_ids
    c = run(logits, make_states(params), seed=6).token_ids
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_counter_noise_is_exponential_and_a_pure_function_of_its_counters() -> None:
    seeds, counters = torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0])
    e = counter_exponential(seeds, counters, 50_000)
    assert torch.equal(e, counter_exponential(seeds, counters, 50_000))  # deterministic
    assert not torch.equal(e[0], e[1]) and not torch.equal(e[0], e[2])  # counter and seed matter
    # Kolmogorov–Smirnov against Exp(1): sup |F_n − F| < 1.95 / sqrt(n) at p ≈ 0.001.
    for row in e:
        x = row.double().sort().values
        n = x.numel()
        cdf = 1 - torch.exp(-x)
        ranks = torch.arange(1, n + 1, dtype=torch.float64) / n
        assert float((ranks - cdf).abs().max()) < 1.95 / n**0.5
    # Rows with different keys are uncorrelated (|r| < 4 / sqrt(n)).
    r = torch.corrcoef(e.double())[0, 1:]
    assert float(r.abs().max()) < 4 / 50_000**0.5


def chi_square_ok(counts: Counter[int], probs: dict[int, float], n: int) -> None:
    """Support exactly the reference's, and a chi-square test at about p = 1e-4."""
    assert set(counts) <= set(probs), set(counts) - set(probs)
    stat = sum((counts.get(i, 0) - n * q) ** 2 / (n * q) for i, q in probs.items())
    dof = len(probs) - 1
    if dof == 0:
        return
    z = 3.72  # Wilson-Hilferty approximation of the chi-square quantile
    crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert stat < crit, (stat, crit, counts, probs)


DIST_PARAMS = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=6),
    SamplingParams(temperature=0.9, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=9, top_p=0.9, min_p=0.1),
]


@pytest.mark.parametrize("p", DIST_PARAMS)
def test_empirical_distribution_matches_reference(p: SamplingParams) -> None:
    n = 20_000
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    row = torch.linspace(-2.0, 2.0, 12)[perm]
    want = ref_distribution(row.tolist(), p)
    out = run(row.expand(n, -1), make_states([p] * n), seed=11)
    chi_square_ok(Counter(out.token_ids.tolist()), want, n)


def test_empirical_distribution_of_seeded_rows() -> None:
    n = 20_000
    p = SamplingParams(temperature=0.8, top_p=0.9)
    row = torch.tensor([0.5, -1.0, 2.0, 1.0, 0.0, -0.5, 1.5, -2.0])
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s) for s in range(n)]
    out = run(row.expand(n, -1), make_states(params))
    chi_square_ok(Counter(out.token_ids.tolist()), ref_distribution(row.tolist(), p), n)


def test_empirical_distribution_of_one_seeded_stream() -> None:
    # One request's successive draws (its counter advancing) are a valid stream too.
    n = 3000
    p = SamplingParams(temperature=1.0, top_k=4, seed=7)
    row = torch.tensor([[1.0, 0.0, 2.0, -1.0, 0.5, 3.0]])
    state = SamplingState(p)
    tokens = []
    for _ in range(n):
        tokens.append(int(run(row, [state]).token_ids))
        state.append(tokens[-1])
    chi_square_ok(Counter(tokens), ref_distribution(row[0].tolist(), p), n)


# ---- edge cases: never NaN ----------------------------------------------------------


EDGE_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.0),
    SamplingParams(top_p=1e-9),
    SamplingParams(min_p=1.0),
    SamplingParams(top_k=1),
    SamplingParams(top_k=50, top_p=0.5, min_p=0.5, temperature=2.0),
    SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=-1.0),
]


@pytest.mark.parametrize("p", EDGE_PARAMS)
def test_one_finite_logit_is_always_chosen(p: SamplingParams) -> None:
    logits = torch.full((3, 64), -INF)
    logits[:, 17] = torch.tensor([-50.0, 0.0, 50.0])
    p2 = SamplingParams(**{**_fields(p), "logprobs": 3})
    states = make_states([p2] * 3, prompts=[[17, 3]] * 3, outputs=[[17]] * 3)
    out = run(logits, states, seed=0)
    assert out.token_ids.tolist() == [17, 17, 17]
    assert out.logprobs is not None and torch.equal(out.logprobs, torch.zeros(3))
    assert out.top_logprobs is not None and not out.top_logprobs.values.isnan().any()


@pytest.mark.parametrize("p", EDGE_PARAMS)
def test_minus_inf_prefix_never_sampled(p: SamplingParams) -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(200, 64, generator=g)
    logits[:, :40] = -INF
    out = run(logits, make_states([p] * 200), seed=2)
    assert (out.token_ids >= 40).all()


def test_tiny_top_p_and_full_min_p_are_greedy() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(50, 1000, generator=g)
    for p in (SamplingParams(top_p=1e-9), SamplingParams(min_p=1.0)):
        assert torch.equal(run(logits, make_states([p] * 50), seed=4).token_ids, logits.argmax(-1))


def test_all_minus_inf_row_picks_token_zero_without_nan() -> None:
    logits = torch.full((2, 32), -INF)
    logits[1] = torch.randn(32)
    params = [SamplingParams(logprobs=2, top_p=0.5), SamplingParams(logprobs=2)]
    out = run(logits, make_states(params))
    assert out.token_ids[0].item() == 0
    assert out.logprobs is not None and out.top_logprobs is not None
    assert not out.logprobs.isnan().any() and not out.top_logprobs.values.isnan().any()
    assert out.logprobs[0].item() == -INF


def test_min_tokens_masking_everything_falls_back_to_raw_argmax() -> None:
    logits = torch.full((1, 10), -INF)
    logits[0, 2] = 1.0  # only the EOS id is possible
    out = run(logits, make_states([SamplingParams(min_tokens=3)], eos=frozenset({2})))
    assert out.token_ids.item() == 2


# ---- min_tokens ---------------------------------------------------------------------


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    V = 20
    logits = torch.zeros(1, V)
    logits[0, 3], logits[0, 7], logits[0, 9], logits[0, 5] = 10.0, 9.0, 8.0, 1.0
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[7])
    state = SamplingState(p, eos_ids=frozenset({3, 9}))
    batch = SamplingBatch.build([state], V, "cpu")
    masked = apply_penalties(logits.clone(), batch)
    assert {i for i in range(V) if masked[0, i] == -INF} == {3, 7, 9}
    assert run(logits, [state]).token_ids.item() == 5
    state.append(5)
    assert run(logits, [state]).token_ids.item() == 5
    state.append(5)
    assert run(logits, [state]).token_ids.item() == 3  # reached: EOS allowed again


def test_ignore_eos_does_not_mask_eos() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    state = SamplingState(SamplingParams(temperature=0.0, ignore_eos=True), eos_ids=frozenset({1}))
    assert run(logits, [state]).token_ids.item() == 1


# ---- logprobs -----------------------------------------------------------------------


def test_logprobs_are_the_raw_distribution() -> None:
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 300, generator=g) * 4
    params = [
        SamplingParams(logprobs=5, temperature=0.5, top_k=10, repetition_penalty=1.5),
        SamplingParams(logprobs=0),
        SamplingParams(),
        SamplingParams(logprobs=2, temperature=0.0, presence_penalty=2.0),
    ]
    out = run(logits, make_states(params, prompts=[[1, 2, 3]] * 4, outputs=[[4, 5]] * 4), seed=8)
    ref = torch.log_softmax(logits.double(), -1)
    assert out.logprobs is not None and out.top_logprobs is not None
    want = ref.gather(1, out.token_ids[:, None]).squeeze(1)
    # float32 log_softmax over 300 logits against float64
    atol = log_softmax_atol(torch.float32, logits.shape[1], ref.abs().max().item())
    torch.testing.assert_close(out.logprobs.double(), want, rtol=0, atol=atol)
    assert out.top_logprobs.ids.shape == (4, 5)
    torch.testing.assert_close(out.top_logprobs.values.double(), ref.topk(5).values, rtol=0, atol=atol)
    assert torch.equal(out.top_logprobs.ids, ref.topk(5).indices)


def test_logprobs_absent_unless_asked() -> None:
    logits = torch.randn(2, 50)
    out = run(logits, make_states([SamplingParams(), SamplingParams(temperature=0.0)]))
    assert out.logprobs is None and out.top_logprobs is None
    out = run(logits, make_states([SamplingParams(logprobs=0), SamplingParams()]))
    assert out.logprobs is not None and out.top_logprobs is None


def test_bf16_logits_are_computed_in_float32_and_not_modified() -> None:
    logits = (torch.randn(3, 80) * 3).to(torch.bfloat16)
    before = logits.clone()
    params = [SamplingParams(logprobs=1, repetition_penalty=2.0, temperature=0.0)] * 3
    out = run(logits, make_states(params, prompts=[[0, 1, 2]] * 3))
    assert torch.equal(logits, before)
    assert out.logprobs is not None and out.logprobs.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(1, out.token_ids[:, None]).squeeze(1)
    # the same float32 log_softmax of the upcast logits, maybe through another kernel path
    atol = log_softmax_atol(torch.float32, logits.shape[1], ref.abs().max().item())
    torch.testing.assert_close(out.logprobs, ref, rtol=0, atol=atol)


def test_float32_logits_are_not_modified_in_place() -> None:
    logits = torch.randn(2, 30)
    before = logits.clone()
    p = SamplingParams(min_tokens=5, presence_penalty=1.0, repetition_penalty=1.2)
    run(logits, make_states([p] * 2, prompts=[[3]] * 2, outputs=[[1, 2]] * 2, eos=frozenset({0})))
    assert torch.equal(logits, before)


def _fields(p: SamplingParams) -> dict[str, object]:
    return {f: getattr(p, f) for f in p.__struct_fields__}


def test_a_filtered_token_never_wins_where_its_noise_rounds_to_zero() -> None:
    """The counter's top 24-bit value made U round to 1.0 in float32, so E = 0, log E =
    -inf, and a filtered token's -inf - log E was NaN — which argmax picks. Found where
    it happens (a pure function of seed, counter and token id), that token is filtered
    and must not be drawn."""
    from edgemoe.engine.sampler import _STEP, _shr, _splitmix64, _token_hashes

    V, seeds = 4096, torch.arange(8192)
    counters = torch.zeros_like(seeds)
    key = _splitmix64(seeds ^ (counters * _STEP))[:, None]
    top = _shr(_splitmix64(key ^ _token_hashes(V, seeds.device)[None, :]), 40) == (1 << 24) - 1
    row, token = (int(i) for i in top.nonzero()[0])  # one (seed, token) with the top value
    assert counter_exponential(seeds[row:row + 1], counters[:1], V)[0, token] > 0
    logits = torch.zeros(1, V)
    logits[0, token] = -INF  # filtered (a structured output's mask, top-k, top-p, min-p)
    states = make_states([SamplingParams(temperature=1.0, seed=int(seeds[row]))])
    assert run(logits, states).token_ids.item() != token
