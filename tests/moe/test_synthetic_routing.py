"""Synthetic routing for cache studies: the setting's grammar; the process's measured
statistics (computed here by plain set arithmetic) hit the published Qwen3-30B-A3B
targets, or other requested ones; the process draws as a plain token-by-token
implementation of its definition does; each sequence keeps its own history; seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgemoe.moe.routing_spec import RoutingSpec, parse_routing
from edgemoe.moe.routing_trace import Access, RoutingTrace
from edgemoe.moe.synthetic_routing import Params, RoutingProcess, SyntheticRouting, measure

LAYERS, EXPERTS, K = 48, 128, 8  # Qwen3-30B-A3B


def test_the_setting_grammar() -> None:
    assert parse_routing("router") is None
    assert parse_routing("synthetic") == RoutingSpec()
    spec = parse_routing("synthetic:seed=3,repeat=0.3,window=0.6,top=0.03")
    assert spec == RoutingSpec(seed=3, repeat=0.3, window=0.6, top=0.03)
    assert parse_routing(spec.label) == spec  # the label every output carries reads back
    for bad in ("synthetc", "synthetic:speed=1", "synthetic:repeat=x", "synthetic:repeat=0.9,window=0.5", "synthetic:top=0"):
        with pytest.raises(ValueError, match=r"routing \(--routing\)"):
            parse_routing(bad)


def plain_statistics(seq: list[list[set[int]]]) -> tuple[float, float, float]:
    """seq[t][layer] = the set of experts of token t: (share of a token's experts used by
    the previous token, by one of the previous 8, the most used expert's share of routes)."""
    T, L = len(seq), len(seq[0])
    rep = win = 0
    for t in range(T):
        for layer in range(L):
            now = seq[t][layer]
            if t >= 1:
                rep += len(now & seq[t - 1][layer])
            if t >= 8:
                win += len(now & set().union(*(seq[t - j][layer] for j in range(1, 9))))
    routes = [np.bincount([e for t in range(T) for e in seq[t][layer]], minlength=EXPERTS) for layer in range(L)]
    top = float(np.mean([r.max() / r.sum() for r in routes]))
    return rep / ((T - 1) * L * K), win / ((T - 8) * L * K), top


def decode_sequence(routing: SyntheticRouting, tokens: int, rows: tuple[int, ...] = (0,)) -> dict[int, list[list[set[int]]]]:
    """Decode `tokens` steps of one token for each of `rows` (all starting fresh): each row's sets."""
    seqs: dict[int, list[list[set[int]]]] = {r: [] for r in rows}
    for step in range(tokens):
        routing.prepare([1] * len(rows), [step + 1] * len(rows), list(rows))
        step_ids = routing.last  # [layers, T, K]
        for i, r in enumerate(rows):
            seqs[r].append([set(step_ids[layer, i].tolist()) for layer in range(LAYERS)])
    return seqs


@pytest.fixture(scope="module")
def qwen3_routing() -> SyntheticRouting:
    return SyntheticRouting(RoutingSpec(seed=1), list(range(LAYERS)), EXPERTS, K)


def test_statistics_match_the_published_targets(qwen3_routing: SyntheticRouting) -> None:
    seq = decode_sequence(qwen3_routing, 400)[0]
    assert all(len(s) == K for tok in seq for s in tok)  # K distinct experts per token and layer
    repeat, window, top = plain_statistics(seq)
    # calibration residual and sampling noise over 400 tokens x 48 layers: a few thousandths
    assert abs(repeat - 0.45) < 0.03 and abs(window - 0.80) < 0.03
    assert 0.04 < top < 0.06


def test_other_targets_are_met_too() -> None:
    spec = RoutingSpec(seed=2, repeat=0.25, window=0.6, top=0.03)
    seq = decode_sequence(SyntheticRouting(spec, list(range(LAYERS)), EXPERTS, K), 300)[0]
    repeat, window, top = plain_statistics(seq)
    assert abs(repeat - 0.25) < 0.03 and abs(window - 0.6) < 0.03 and 0.024 < top < 0.036


@pytest.mark.parametrize(("layers", "experts", "k", "params"), [
    (LAYERS, EXPERTS, K, Params(zipf=0.72, keep=0.42, back=0.11)),  # Qwen3-30B-A3B, calibrated
    (3, 60, 4, Params(zipf=0.7, keep=0.4, back=0.1)),  # E not a power of two
    (2, 8, 8, Params(zipf=0.7, keep=0.4, back=0.1)),  # K = E: every expert, every token
    (4, 64, 6, Params(zipf=4.0, keep=0.4, back=0.1)),  # popularity so steep that draws repeat
    (4, 64, 6, Params(zipf=0.7, keep=1.0, back=1.0)),
    (4, 64, 6, Params(zipf=0.0, keep=0.0, back=0.0)),
])
def test_k_distinct_experts_seeded_however_the_tokens_are_split(layers: int, experts: int, k: int,
                                                                 params: Params) -> None:
    n = 150  # more than a block of drawn-ahead random numbers
    ids = (p := RoutingProcess(layers, experts, k, params, seed=1)).tokens(p.stream(), n)
    assert ids.dtype == np.int64 and ids.shape == (n, layers, k)
    assert ids.min() >= 0 and ids.max() < experts
    assert (np.diff(np.sort(ids, axis=2), axis=2) > 0).all()  # K distinct per token and layer
    same = RoutingProcess(layers, experts, k, params, seed=1)
    stream = same.stream()
    assert np.array_equal(np.concatenate([same.tokens(stream, m) for m in (1, 6, 70, 73)]), ids)
    if k < experts:
        other = RoutingProcess(layers, experts, k, params, seed=2)
        assert not np.array_equal(other.tokens(other.stream(), n), ids)
        assert not np.array_equal(same.tokens(same.stream(1), n), ids)  # the next sequence: its own numbers


def plain_process(experts: int, k: int, params: Params, seed: int, tokens: int) -> np.ndarray:
    """The process's definition token by token for one layer, by set arithmetic [T, 1, K]:
    keep each of t-1's experts with probability keep; take back each of t-2 … t-8's (not
    t-1's) with probability back, as many as fit, in a random order; fill the rest by
    popularity without replacement (Gumbel top-k; expert e has popularity rank e+1)."""
    rng = np.random.default_rng(seed)
    log_p = -params.zipf * np.log(np.arange(1, experts + 1))
    history: list[set[int]] = []
    out = []
    for _ in range(tokens):
        prev = history[-1] if history else set()
        chosen = [e for e in sorted(prev) if rng.random() < params.keep]
        back = [e for e in sorted(set().union(*history[-8:-1]) - prev) if rng.random() < params.back]
        rng.shuffle(back)
        chosen += back[: k - len(chosen)]
        for e in np.argsort(log_p - np.log(-np.log(rng.random(experts))))[::-1]:
            if len(chosen) == k:
                break
            if e not in chosen:
                chosen.append(int(e))
        history.append(set(chosen))
        out.append(chosen)
    return np.array(out)[:, None, :]


def overlap_profile(ids: np.ndarray, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distribution of |token ∩ t-1| over tokens and layers; for lags 2 … 8, the mean
    number of experts a token shares with t-lag and not with a later token)."""
    T, L, K = ids.shape
    used = np.zeros((T, L, experts), dtype=bool)
    np.put_along_axis(used, ids, True, axis=2)
    repeat = (used[1:] & used[:-1]).sum(axis=2).ravel()
    by_lag = []
    for lag in range(2, 9):
        newer = np.zeros((T - 8, L, experts), dtype=bool)
        for j in range(1, lag):
            newer |= used[8 - j : T - j]
        by_lag.append((used[8:] & used[8 - lag : T - lag] & ~newer).sum(axis=2).mean())
    return np.bincount(repeat, minlength=K + 1) / repeat.size, np.array(by_lag)


@pytest.mark.parametrize("params", [
    Params(zipf=0.7, keep=0.4, back=0.1),
    Params(zipf=1.2, keep=0.6, back=0.5),  # back's takes often outnumber the room left:
    Params(zipf=0.4, keep=0.3, back=0.8),  # which ones fit must be a uniform choice
])
def test_the_process_draws_as_its_plain_definition(params: Params) -> None:
    """Against `plain_process`: the same distribution of each token's overlap with t-1,
    of what it takes back from each earlier token, and of the most used expert's share
    (sampling noise here ~0.03; taking back the most recent first instead would be off
    by 0.3 and more)."""
    experts, k = (24 if params.back > 0.5 else 64), 6
    plain = np.concatenate([plain_process(experts, k, params, seed, 1500) for seed in range(4)], axis=1)
    process = RoutingProcess(8, experts, k, params, seed=0)
    ids = process.tokens(process.stream(), 1500)
    (plain_repeat, plain_lags), (repeat, lags) = overlap_profile(plain, experts), overlap_profile(ids, experts)
    assert 0.5 * np.abs(plain_repeat - repeat).sum() < 0.05
    assert np.abs(plain_lags - lags).max() < 0.08
    assert abs(measure(plain, experts)[2] - measure(ids, experts)[2]) < 0.015


def test_each_sequence_keeps_its_own_history(qwen3_routing: SyntheticRouting) -> None:
    # two sequences decoding side by side: each alone has the target repeat share
    # (mixed into one stream, it would be the two-token overlap, ~0.28)
    seqs = decode_sequence(qwen3_routing, 150, rows=(3, 7))
    for seq in seqs.values():
        assert abs(plain_statistics(seq)[0] - 0.45) < 0.04


def test_seeded_and_prefill_sized() -> None:
    a, b, c = (SyntheticRouting(RoutingSpec(seed=s), [1, 3], 16, 4, max_tokens=8) for s in (5, 5, 6))
    for r in (a, b, c):
        r.prepare([5, 1], [5, 9], [0, 1])  # a 5-token prompt and a decode token
    assert a.last.shape == (2, 6, 4)
    assert np.array_equal(a.last, b.last) and not np.array_equal(a.last, c.last)
    router_ids = torch.zeros(6, 4, dtype=torch.int32)
    assert np.array_equal(a.ids(3, router_ids).numpy(), a.last[1])
    with pytest.raises(RuntimeError, match="the router made"):
        a.ids(1, torch.zeros(2, 4, dtype=torch.int32))


def test_staged_ids_live_in_one_buffer_and_padding_rows_hold_the_filler() -> None:
    """Every step's draws land in the same device storage (what a captured graph reads);
    a padded step's padding rows hold the fixed filler ids (experts 0..K-1, whatever the
    router made) and draw nothing, so the process runs the same padded or not."""
    layers, E, K = [0, 2, 5], 16, 4
    padded, plain = (SyntheticRouting(RoutingSpec(seed=9), layers, E, K, max_tokens=8) for _ in range(2))
    storage = padded.staged.buffer.data_ptr()
    g = torch.Generator().manual_seed(0)
    warm_up = torch.randint(0, E, (4, K), generator=g, dtype=torch.int32)
    assert torch.equal(padded.ids(2, warm_up), warm_up)  # nothing staged yet (a graph's warm-up): all padding
    for step, (n, size) in enumerate([(3, 4), (1, 1), (2, 2), (5, 8)]):
        rows, lens = list(range(n)), [step + 2] * n  # n sequences decoding
        padded.prepare([1] * n, lens, rows, size)
        plain.prepare([1] * n, lens, rows)
        assert np.array_equal(padded.last, plain.last)  # the same draws with padding as without
        router = torch.randint(0, E, (size, K), generator=g, dtype=torch.int32)
        for i, layer in enumerate(layers):
            got = padded.ids(layer, router)
            assert np.array_equal(got[:n].numpy(), padded.last[i])  # the real rows: this step's draws
            assert got[n:].tolist() == [list(range(K))] * (size - n)  # the padding rows: the filler
            real = padded.real_ids(layer, torch.full((size, K), -1, dtype=torch.int32))  # the prefetch oracle's view
            assert torch.equal(real[:n], got[:n]) and bool((real[n:] == -1).all())
            assert np.array_equal(plain.ids(layer, router[:n]).numpy(), plain.last[i])
        assert padded.staged.buffer.data_ptr() == storage  # one storage across steps
    with pytest.raises(ValueError, match="for 9 rows"):
        padded.prepare([1] * 2, [3, 3], [0, 1], 9)  # past the largest step


def test_draws_are_recorded_for_the_trace() -> None:
    """The trace hears each step's draws per MoE layer (real rows only) from `prepare`:
    a graph-replayed step runs no MoE block in Python, yet its accesses are recorded."""
    routing = SyntheticRouting(RoutingSpec(seed=3), [1, 3], 16, 4, max_tokens=8)
    routing.trace = trace = RoutingTrace()
    trace.start()
    want = []
    for q, total, size in ((2, 2, None), (1, 3, 4)):  # a 2-token prompt, then its decode padded to 4
        routing.prepare([q], [total], [0], size)
        want += [Access(layer, tuple(sorted(set(routing.last[i].flatten().tolist())))) for i, layer in enumerate([1, 3])]
    assert trace.stop() == want
