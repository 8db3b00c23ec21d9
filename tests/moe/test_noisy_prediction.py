"""Decode prefetch's guess of chosen recall under `--routing synthetic:recall=R`
(`moe/noisy_prediction.py`): a guess of K distinct experts per row, keeping each routed
one with probability R, the others plausible (popular) experts the row does not route to;
staged for prefetch beside the draws, the oracle's view unchanged at R = 1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgemoe.moe import cpu_share, synthetic_routing
from edgemoe.moe.noisy_prediction import predict, wrong_share
from edgemoe.moe.predictors import StagedPredictor
from edgemoe.moe.routing_spec import RoutingSpec, parse_routing
from edgemoe.moe.synthetic_routing import Params, RoutingProcess, SyntheticRouting

LAYERS, EXPERTS, K = 6, 128, 8


def routed(process: RoutingProcess, tokens: int) -> np.ndarray:
    """[layers, tokens, K] ids of one sequence."""
    return np.ascontiguousarray(process.tokens(process.stream(), tokens).transpose(1, 0, 2))


@pytest.fixture(scope="module")
def process() -> RoutingProcess:
    return RoutingProcess(LAYERS, EXPERTS, K, Params(zipf=0.8, keep=0.4, back=0.1), seed=5)


def test_the_setting_reads_recall_and_labels_it() -> None:
    spec = parse_routing("synthetic:seed=2,recall=0.8")
    assert spec == RoutingSpec(seed=2, recall=0.8)
    assert spec.label.endswith(",recall=0.8") and parse_routing(spec.label) == spec
    assert "recall" not in RoutingSpec().label  # the oracle's label as every earlier output has it
    spec = parse_routing("synthetic:recall=0.5,precision=0.9")
    assert spec == RoutingSpec(recall=0.5, precision=0.9) and parse_routing(spec.label) == spec
    for bad in ("synthetic:recall=1.5", "synthetic:recall=-0.1", "synthetic:recall=nan", "synthetic:recall=x",
                "synthetic:recall=0.8,precision=0.5", "synthetic:recall=0.5,precision=1.5"):
        with pytest.raises(ValueError, match=r"routing \(--routing\)"):
            parse_routing(bad)


@pytest.mark.parametrize("recall", [0.0, 0.5, 0.8, 1.0])
def test_a_guess_has_k_distinct_experts_and_the_recall_asked(process: RoutingProcess, recall: float) -> None:
    ids = routed(process, 400)
    guess = predict(ids, recall, process, np.random.default_rng(1))
    assert guess.shape == ids.shape and guess.dtype == ids.dtype
    assert all(len(set(row.tolist())) == K for row in guess.reshape(-1, K))
    hits = sum(len(set(g.tolist()) & set(r.tolist())) for g, r in zip(guess.reshape(-1, K), ids.reshape(-1, K)))
    n = ids.size
    # each routed expert is kept independently: a binomial count, allowed 5 standard deviations
    assert abs(hits - recall * n) <= 5 * np.sqrt(n * recall * (1 - recall)) + 1e-9


def test_wrong_guesses_follow_popularity(process: RoutingProcess) -> None:
    ids = routed(process, 400)
    guess = predict(ids, 0.0, process, np.random.default_rng(2))
    ranks = np.empty_like(guess)  # each guessed expert's popularity rank in its layer
    for layer in range(LAYERS):
        by_rank = process.by_rank[layer * EXPERTS:(layer + 1) * EXPERTS] - layer * EXPERTS
        rank_of = np.argsort(by_rank)
        ranks[layer] = rank_of[guess[layer]]
    counts = np.bincount(ranks.ravel(), minlength=EXPERTS)
    assert counts[: EXPERTS // 4].sum() > 2 * counts[-EXPERTS // 4 :].sum()  # the popular quarter named most


def test_rows_with_no_expert_left_keep_their_own() -> None:
    tiny = RoutingProcess(1, 5, 4, Params(zipf=0.5, keep=0.3, back=0.1), seed=1)
    ids = routed(tiny, 50)
    guess = predict(ids, 0.0, tiny, np.random.default_rng(3))
    for g, r in zip(guess.reshape(-1, 4), ids.reshape(-1, 4)):
        assert len(set(g.tolist())) == 4 and len(set(g.tolist()) - set(r.tolist())) == 1  # one expert was free


def test_the_guess_is_staged_for_prefetch_beside_the_draws() -> None:
    layers, E = [0, 2, 5], 32
    routing = SyntheticRouting(RoutingSpec(seed=4, recall=0.5), layers, E, 4, max_tokens=128)
    predictor = StagedPredictor(routing)
    assert predictor.label == "synthetic guess, recall 0.5"
    fill = torch.full((4, 4), -1, dtype=torch.int32)
    differ = 0
    for step in range(20):
        routing.prepare([1] * 3, [step + 1] * 3, [0, 1, 2], 4)  # three sequences padded to 4 rows
        for i, layer in enumerate(layers):
            got = predictor(layer, torch.zeros(4, 8), fill)
            assert bool((got[3:] == -1).all())  # the padding row: fill's
            assert all(len(set(row.tolist())) == 4 for row in got[:3])
            differ += int((np.sort(got[:3].numpy(), 1) != np.sort(routing.last[i], 1)).any())
            assert torch.equal(routing.real_ids(layer, fill)[:3], torch.from_numpy(routing.last[i]).int())
    assert differ > 0  # a guess, not the draws
    before = routing.predicted.buffer.clone()
    routing.prepare([100], [100], [5])  # a prompt chunk wider than any step that prefetches: no guess drawn
    assert torch.equal(routing.predicted.buffer, before)


def test_at_recall_one_prefetch_reads_the_draws() -> None:
    routing = SyntheticRouting(RoutingSpec(seed=4), [0, 1], 16, 4, max_tokens=8)
    assert routing.predicted is None and StagedPredictor(routing).label == "synthetic oracle"
    routing.prepare([1], [1], [0])
    fill = torch.full((1, 4), -1, dtype=torch.int32)
    assert torch.equal(routing.predicted_ids(1, fill), routing.real_ids(1, fill))


def test_a_guess_is_drawn_for_every_step_that_prefetches() -> None:
    assert synthetic_routing.PREDICTED_ROWS == cpu_share.ROWS  # prefetch's widest step (moe/prefetch.py)


@pytest.mark.parametrize(("recall", "precision"), [(0.5, 0.9), (0.4, 0.98), (0.7, 0.7), (0.3, 1.0)])
def test_a_confident_guess_has_the_precision_asked(process: RoutingProcess, recall: float, precision: float) -> None:
    """`precision=P`: a smaller guess (-1 where nothing is named), R·K right experts a row and
    the wrong ones in proportion, so right / named is P (each a binomial count: 5 sigmas)."""
    ids = routed(process, 400)
    guess = predict(ids, recall, process, np.random.default_rng(4), precision)
    named = guess >= 0
    rows = zip(guess.reshape(-1, K), ids.reshape(-1, K))
    right = sum(len(set(g[g >= 0].tolist()) & set(r.tolist())) for g, r in rows)
    n = ids.size
    assert abs(right - recall * n) <= 5 * np.sqrt(n * recall * (1 - recall)) + 1e-9
    wrong = int(named.sum()) - right
    q = wrong_share(recall, precision)
    dropped = n - right
    assert abs(wrong - q * dropped) <= 5 * np.sqrt(dropped * q * (1 - q)) + 1e-9
    for row in guess.reshape(-1, K):
        kept = row[row >= 0].tolist()
        assert len(set(kept)) == len(kept)  # distinct experts; -1 names none


def test_a_confident_guess_with_missing_entries_runs_through_the_engine(qwen3_ckpt) -> None:  # noqa: ANN001
    """-1 entries (nothing named) reach the prefetch's plan, as padding rows' do."""
    from edgemoe import LLM, SamplingParams

    prompts = [[9707, 11, 1879], list(range(3000, 3020))]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = {}
    for prefetch in ("off", "on"):
        with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", expert_cache="device", moe_slots=8,
                 moe_prefetch=prefetch, routing="synthetic:seed=1,recall=0.5,precision=0.9") as llm:
            out[prefetch] = [o.token_ids for o in llm.generate(prompts, greedy)]
            moe = llm.stats()["moe"]
    assert out["on"] == out["off"]
    assert moe["prefetch"] == "synthetic guess, recall 0.5, precision 0.9" and moe["prefetched"] > 0
