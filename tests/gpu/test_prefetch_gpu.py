"""Decode prefetch (moe/prefetch.py) on the GPU: the next layer's plan on the stream, its
copies on a side stream (the gather), or on the copy engine through the copier's thread
(`EDGEMOE_PREFETCH_MOVER=copy`), awaited just before that layer computes (its own plan pins
the slots still being filled). Every test runs with both movers.

- executor level (eager): decode-sized steps give bitwise the resident executor's outputs
  with an oracle predictor and with a wrong one (a random router), and every mapped slot
  holds its expert's bytes after each step (a copy racing a plan or a compute shows here);
- engine level (decode steps replayed from CUDA graphs, the side stream captured as a
  fork and a join): greedy tokens with prefetch equal those without, with the router's
  prediction and under synthetic routing (the oracle), where every prefetched expert is used.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe import LLM, SamplingParams
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.predictors import RouterPredictor
from edgemoe.moe.registry import make_executor
from edgemoe.testing.moe_material import KnownRouting, random_bank_store

CUDA = torch.device("cuda")
L, E, K, H, I = 6, 16, 4, 1024, 512


@pytest.mark.parametrize("mover", ["gather", "copy"])
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("predictor", ["oracle", "router"])
@pytest.mark.parametrize("roomy", [False, True])  # one-token steps prefetch; every step (up to 4 rows) does
def test_prefetched_steps_match_resident(predictor: str, roomy: bool, depth: int, mover: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", str(depth))
    monkeypatch.setenv("EDGEMOE_PREFETCH_MOVER", mover)
    monkeypatch.setenv("EDGEMOE_COPIER", "1")  # opt-in (moe/movers.CopierMover's note)
    slots = (depth + 1) * K * (4 if roomy else 1) + 2  # `covers`: depth + 1 layers' worth
    store = random_bank_store(L, E, H, I, torch.bfloat16, pinned=True)
    ex = make_executor("offload", store, CUDA, F.silu, L, slots, expert_cache="device")
    resident = make_executor("resident", store, CUDA, F.silu, L, 0)
    assert isinstance(ex, DeviceOffloadExecutor)
    oracle = KnownRouting()
    routers = {layer: torch.randn(E, H, device=CUDA, dtype=torch.bfloat16) for layer in range(L)}
    gains = {layer: torch.rand(H, device=CUDA) + 0.5 for layer in range(L)}  # the norm-gain fold's launch too
    ex.enable_prefetch(oracle if predictor == "oracle" else RouterPredictor(routers, K, gains), K)
    g = torch.Generator(device=CUDA).manual_seed(1)
    for step in range(12):
        T = 1 + step % 4
        x = torch.randn(T, H, device=CUDA, generator=g, dtype=torch.bfloat16)
        ids = {layer: torch.stack([torch.randperm(E, device=CUDA, generator=g)[:K] for _ in range(T)]).int()
               for layer in range(L)}
        oracle.step = ids
        w = torch.softmax(torch.randn(T, K, device=CUDA, generator=g), -1)
        for layer in range(L):
            assert torch.equal(ex.forward(layer, x, ids[layer], w), resident.forward(layer, x, ids[layer], w))
        torch.cuda.synchronize()
        for layer in range(L):
            for e in range(E):
                slot = int(ex.cache.slot_map[layer, e])
                if slot >= 0:
                    assert torch.equal(ex.slots.gate_up[slot].cpu(), store.banks[layer].gate_up[e]), (step, layer, e)
    snap = ex.stats.snapshot()
    ex.close()
    assert snap["prefetched"] > 0 and snap["prefetch_mover"] == mover
    if mover == "copy":  # eager steps: the copies made at the issue, not rung (moe/movers.CopierMover's note)
        assert snap["copier_errors"] == 0 and snap["copier_rings"] == 0
    if predictor == "oracle":
        assert snap["prefetch_used"] == snap["prefetched"]


@pytest.mark.parametrize("mover", ["gather", "copy", "chain-copy"])  # chain-copy: --expert-mover copy, one copier
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("routing", ["router", "synthetic:seed=3"])
def test_graph_replayed_prefetch_keeps_the_greedy_tokens(small_ckpt, routing: str, depth: int, mover: str,  # noqa: ANN001
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", str(depth))
    monkeypatch.setenv("EDGEMOE_COPIER", "1")  # opt-in (moe/movers.CopierMover's note)
    if mover != "chain-copy":
        monkeypatch.setenv("EDGEMOE_PREFETCH_MOVER", mover)
    chain = "copy" if mover == "chain-copy" else "gather"
    prompts = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]
    # A padded batch of 4 routes up to 16 experts a layer; a step prefetches when the pool
    # holds depth + 1 layers' worth (its own, and those of the layers ahead in flight). At
    # depth 3 that is all 64 experts, which leaves nothing to miss: two prompts (8 a layer).
    rows = 2 if depth == 3 else 4
    prompts = prompts[:rows]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out = {}
    for prefetch in ("off", "on"):
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload",
                 moe_slots=24 + 4 * rows * depth,
                 expert_cache="device", moe_prefetch=prefetch, routing=routing, expert_mover=chain) as llm:
            assert llm.engine.runner.graphs is not None
            out[prefetch] = [o.token_ids for o in llm.generate(prompts, greedy)]
            moe = llm.stats()["moe"]
    assert out["on"] == out["off"]
    assert moe["prefetched"] > 0 and moe["prefetch_depth"] == depth
    assert moe["prefetch_mover"] == mover.removeprefix("chain-") and moe["expert_mover"] == chain
    if routing != "router":
        assert moe["prefetch"] == "synthetic oracle" and moe["prefetch_used"] == moe["prefetched"]


def test_a_guess_replayed_from_graphs_keeps_the_greedy_tokens(small_ckpt) -> None:  # noqa: ANN001
    """`--routing synthetic:recall=0.6`: the guess's own staged buffer read by captured
    steps; the tokens are prefetch-off's, and some of its copies go unused."""
    prompts = [list(range(2000, 2041)), [9707, 11, 1879, 0]]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out = {}
    for prefetch in ("off", "on"):
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=48,
                 expert_cache="device", moe_prefetch=prefetch, routing="synthetic:seed=3,recall=0.6") as llm:
            assert llm.engine.runner.graphs is not None
            out[prefetch] = [o.token_ids for o in llm.generate(prompts, greedy)]
            moe = llm.stats()["moe"]
    assert out["on"] == out["off"]
    assert moe["prefetch"] == "synthetic guess, recall 0.6"
    assert 0 < moe["prefetch_used"] < moe["prefetched"]


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_prefetch_auto_switching_graph_variants_keeps_the_greedy_tokens(small_ckpt, backend: str,  # noqa: ANN001
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--moe-prefetch auto` with a chooser that switches every other step: graphs captured
    with and without prefetch (and with and without the live share under hybrid) replayed in
    turn; the tokens are prefetch-off's."""
    from functools import partial

    import edgemoe.moe.step_variants as step_variants
    from edgemoe.engine.graphs import DecodeGraphs
    from edgemoe.moe.prefetch_choice import split_variant

    monkeypatch.setattr(step_variants, "PrefetchChooser", partial(step_variants.PrefetchChooser, window=1, settle=0,
                                                                  rounds=1, max_rounds=1, hold=1))
    replayed, replay = [], DecodeGraphs.replay
    monkeypatch.setattr(DecodeGraphs, "replay", lambda self, *a: replayed.append(self.variants.graph_variant)
                        or replay(self, *a))
    prompts = [list(range(2000, 2041)), [9707, 11, 1879, 0]]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out = {}
    for prefetch in ("off", "auto"):
        replayed.clear()  # the auto run's replays are kept
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", moe_backend=backend, moe_slots=48,
                 expert_cache="device", moe_prefetch=prefetch, routing="synthetic:seed=3,recall=0.6") as llm:
            graphs = llm.engine.runner.graphs
            out[prefetch] = [o.token_ids for o in llm.generate(prompts, greedy)]
            moe = llm.stats()["moe"]
    assert out["auto"] == out["off"]
    variants = {variant for _, variant in graphs.graphs}
    assert {v for v in variants if v is not None and v.endswith("prefetch")} and len(variants) in (2, 4)
    # Replays ran both ways (under hybrid a re-check waits for the live quota to hold a level,
    # which these few steps don't reach: one verdict there, offload re-checks every other step).
    assert {split_variant(v)[1] for v in replayed} == {True, False}
    assert moe["prefetch_auto_verdicts"] >= (1 if backend == "hybrid" else 2) and moe["prefetched"] > 0


@pytest.mark.parametrize("biased", [False, True])
def test_the_fused_router_predicts_a_top_k_of_the_logits(biased: bool) -> None:
    """The predictor's one fused launch (plain and gpt-oss-biased routers) picks k experts
    whose logits are each at least the k-th largest, within the bf16 rounding by which its
    sums and cuBLAS's may differ: a top-k, whatever order ties take."""
    from edgemoe.moe.predictors import RouterScores

    g = torch.Generator(device=CUDA).manual_seed(5)
    E_, K_, T = 128, 8, 7
    w = (torch.randn(E_, H, device=CUDA, generator=g) / H**0.5).to(torch.bfloat16)
    bias = torch.randn(E_, device=CUDA, generator=g).to(torch.bfloat16) if biased else None
    predictor = RouterPredictor({0: RouterScores(w, bias)}, K_)
    assert predictor.workspace is not None  # the fused path is the one tested
    x = torch.randn(T, H, device=CUDA, generator=g).to(torch.bfloat16)
    ids = predictor(0, x, torch.full((T, K_), -1, dtype=torch.int32, device=CUDA))
    scores = F.linear(x, w, bias).float()
    kth = torch.topk(scores, K_, dim=-1).values[:, -1:]
    assert ids.dtype == torch.int32 and ids.shape == (T, K_)
    assert all(len(set(row)) == K_ for row in ids.tolist())
    ulp = kth.abs() * 2.0**-7  # the fused sums and cuBLAS's may round a logit a bf16 step apart
    assert bool((scores.gather(1, ids.long()) >= kth - 2 * ulp).all())


def test_the_fused_router_names_only_the_surer_picks() -> None:
    """EDGEMOE_PREFETCH_MIN_PROB on the fused launch: a pick stays when the softmax of its logit
    is at least p, within the bf16 rounding of the fused probabilities; the others are -1."""
    from edgemoe.moe.predictors import RouterScores

    g = torch.Generator(device=CUDA).manual_seed(6)
    E_, K_, T, p = 128, 8, 7, 0.03
    w = (torch.randn(E_, H, device=CUDA, generator=g) * 3 / H**0.5).to(torch.bfloat16)
    x = torch.randn(T, H, device=CUDA, generator=g).to(torch.bfloat16)
    like = torch.full((T, K_), -1, dtype=torch.int32, device=CUDA)
    whole = RouterPredictor({0: RouterScores(w)}, K_)(0, x, like)
    surer = RouterPredictor({0: RouterScores(w)}, K_, min_prob=p)
    assert surer.workspace is not None  # the fused path is the one tested
    got = surer(0, x, like)
    probs = F.linear(x, w).float().softmax(-1).gather(1, whole.long())
    tol = probs * 2.0**-6  # a bf16 logit a step apart moves its probability by about that much
    assert bool(((got == whole) | (got == -1)).all())  # the kept picks stay where they were
    assert bool((probs[got >= 0] >= p - tol[got >= 0]).all()) and bool((probs[got < 0] < p + tol[got < 0]).all())
    assert 0 < int((got < 0).sum()) < got.numel()
