"""Decode prefetch (moe/prefetch.py) on CPU: outputs bitwise the resident executor's with
any predictor (a wrong prediction costs copies, never results); every mapped slot holds its
expert's weights; an oracle's prefetches are all used and leave the next layers no misses;
the CPU share's coldest misses are left to it (`drop_cpu_picks` against a plain loop); the
engine's greedy tokens with `--moe-prefetch on`; the flag's refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe import LLM, SamplingParams
from edgemoe.config import EngineConfig
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.kernels.share_split import decode_take, drop_cpu_picks
from edgemoe.kernels.share_state import FRACTION_ONE
from edgemoe.moe.predictors import RouterPredictor
from edgemoe.moe.prefetch import DecodePrefetch
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import KnownRouting, random_bank_store

L, E, K, H, I = 4, 8, 2, 16, 12
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def store() -> BankStore:
    return random_bank_store(L, E, H, I)


def steps(seed: int, n: int = 12):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        T = [1, 2, 1, 3][i % 4]
        x = torch.randn(T, H, generator=g)
        ids = {layer: torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int() for layer in range(L)}
        yield x, ids, torch.softmax(torch.randn(T, K, generator=g), -1)


def slots_hold_their_experts(ex: DeviceOffloadExecutor, store: BankStore) -> None:
    for layer in range(L):
        for e in range(E):
            slot = int(ex.cache.slot_map[layer, e])
            if slot >= 0:
                assert torch.equal(ex.slots.gate_up[slot], store.banks[layer].gate_up[e]), (layer, e)
                assert torch.equal(ex.slots.down[slot], store.banks[layer].down[e]), (layer, e)


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("predictor", ["oracle", "router"])
@pytest.mark.parametrize("tight", [True, False])  # prefetching one-token steps only, and every step
def test_outputs_are_resident_whatever_the_prediction(store: BankStore, predictor: str, tight: bool, depth: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", str(depth))
    slots = (depth + 1) * K + 1 if tight else 6 * (depth + 1)
    ex = make_executor("offload", store, CPU, F.silu, L, slots, expert_cache="device")
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    assert isinstance(ex, DeviceOffloadExecutor)
    oracle = KnownRouting()
    routers = {layer: torch.randn(E, H, generator=torch.Generator().manual_seed(layer)) for layer in range(L)}
    ex.enable_prefetch(oracle if predictor == "oracle" else RouterPredictor(routers, K), K)
    for x, ids, w in steps(seed=slots):
        oracle.step = ids
        for layer in range(L):
            assert torch.equal(ex.forward(layer, x, ids[layer], w), resident.forward(layer, x, ids[layer], w))
        slots_hold_their_experts(ex, store)
    snap = ex.stats.snapshot()
    assert snap["prefetched"] > 0 and 0 <= snap["prefetch_used"] <= snap["prefetched"]
    if predictor == "oracle":
        assert snap["prefetch_used"] == snap["prefetched"]  # nothing predicted that wasn't routed


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_an_oracle_leaves_later_layers_no_misses(store: BankStore, depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", str(depth))
    ex = make_executor("offload", store, CPU, F.silu, L, L * E, expert_cache="device")
    oracle = KnownRouting()
    ex.enable_prefetch(oracle, K)
    assert ex.prefetch.depth == depth  # type: ignore[union-attr]
    for x, ids, w in steps(seed=3, n=6):
        oracle.step = ids
        for layer in range(L):
            ex.forward(layer, x, ids[layer], w)
    counts = ex.cache.read_counts()
    pf = ex.prefetch.counts.numpy()  # type: ignore[union-attr]
    # Layers after the first: every miss was a prefetch's copy, and every prefetched expert was used.
    assert (counts[1:, 1] == pf[1:, 0]).all() and (pf[1:, 0] == pf[1:, 1]).all()
    assert pf[0].sum() == 0 and counts[0, 1] > 0  # the first layer has no layer before it


def test_drop_cpu_picks_leaves_the_quota_coldest_misses() -> None:
    g = torch.Generator().manual_seed(5)
    for _ in range(60):
        T = int(torch.randint(1, 5, (1,), generator=g))
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
        ids[0, 0] = -1 if T > 1 else ids[0, 0]
        resident = torch.where(torch.rand(E, generator=g) < 0.4, torch.arange(E), -1).int()
        heat = torch.randint(0, 4, (E,), generator=g) * 1024
        quota = torch.tensor(int(torch.randint(0, 4, (1,), generator=g)))
        fraction = int(torch.randint(0, 17, (1,), generator=g))  # sixteenths of the misses
        misses = sorted({int(e) for e in ids.reshape(-1) if e >= 0 and resident[e] < 0},
                        key=lambda e: (int(heat[e]), -e))  # coldest first, ties to the higher id
        cpu = set(misses[: decode_take(len(misses), int(quota), fraction)])
        want = torch.tensor([[-1 if int(e) in cpu else int(e) for e in row] for row in ids], dtype=torch.int32)
        assert torch.equal(drop_cpu_picks(ids, resident, heat, quota, torch.tensor(fraction)), want)
        if fraction == FRACTION_ONE:
            assert torch.equal(drop_cpu_picks(ids, resident, heat, quota), want)  # the default: the quota alone


def native_kernel() -> CpuExperts:
    kernel = CpuExperts(threads=2)
    if not kernel.native:
        pytest.skip("no compiled CPU expert kernel (no C compiler)")
    return kernel


def matches_resident_with_a_share(ex: DeviceOffloadExecutor, store: BankStore, oracle: KnownRouting,
                                  seed: int) -> None:
    """bf16 steps through `ex` (the oracle told each step's routing) against the resident executor's."""
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    for x, ids, w in steps(seed=seed, n=8):
        oracle.step = ids
        x = x.bfloat16()
        for layer in range(L):
            got, want = ex.forward(layer, x, ids[layer], w).float(), resident.forward(layer, x, ids[layer], w).float()
            # The CPU's cells sum in the C kernel's order: the bf16 outputs may differ by one rounding step.
            torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7 * float(want.abs().max()))


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_prefetch_leaves_the_share_its_quota(depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", str(depth))
    kernel = native_kernel()
    bf16 = random_bank_store(L, E, H, I, torch.bfloat16)
    ex = DeviceOffloadExecutor(bf16, CPU, F.silu, L, 6 * (depth + 1), cpu_experts_per_layer=1, cpu_kernel=kernel)
    oracle = KnownRouting()
    ex.enable_prefetch(oracle, K)
    assert isinstance(ex.prefetch, DecodePrefetch)
    matches_resident_with_a_share(ex, bf16, oracle, seed=7)
    snap = ex.stats.snapshot()
    # With an oracle every GPU miss after the first layer was prefetched; the CPU kept its quota.
    assert snap["experts_cpu"] > 0 and snap["prefetch_used"] == snap["prefetched"] > 0


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_an_oracle_with_a_fraction_on_the_cpu_leaves_no_copy_to_the_chain(depth: int,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The share takes a fraction of each layer's misses; the prefetch left it that fraction
    of the predicted misses and copied the rest. At the layer the share counts the copied
    ones as the misses they were, so it takes every expert left to it: with an oracle no copy
    waits for the layer's own plan after the first layer (taking its fraction of what was
    left instead would leave the rest to copies on the chain)."""
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", str(depth))
    kernel = native_kernel()
    bf16 = random_bank_store(L, E, H, I, torch.bfloat16)
    ex = DeviceOffloadExecutor(bf16, CPU, F.silu, L, L * E, cpu_fraction=0.5, cpu_kernel=kernel)  # no evictions
    oracle = KnownRouting()
    ex.enable_prefetch(oracle, K)
    for x, ids, w in steps(seed=13, n=8):
        oracle.step = ids
        for layer in range(L):
            ex.forward(layer, x.bfloat16(), ids[layer], w)
    counts, pf = ex.cache.read_counts(), ex.prefetch.counts.numpy()  # type: ignore[union-attr]
    assert ex.stats.snapshot()["experts_cpu"] > 0 and (pf[1:, 0] == pf[1:, 1]).all()
    assert (counts[1:, 1] == pf[1:, 0]).all(), (counts[:, 1], pf[:, 0])  # every copy after the first layer prefetched
    ex.close()


@pytest.mark.parametrize("top", [False, True])
def test_a_live_quota_drops_picks_only_where_its_share_runs(top: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live quota at level 0 runs the step without the share (its graphs): the prefetch
    then leaves every predicted miss to the link and asks the share nothing (no launches
    on the chain for a pick nobody takes); at a level > 0 it leaves the share its picks."""
    import edgemoe.moe.cpu_share as cpu_share

    kernel = native_kernel()
    calls = []
    monkeypatch.setattr(cpu_share, "drop_cpu_picks", lambda ids, *a: calls.append(1) or drop_cpu_picks(ids, *a))
    bf16 = random_bank_store(L, E, H, I, torch.bfloat16)
    ex = DeviceOffloadExecutor(bf16, CPU, F.silu, L, 12, cpu_kernel=kernel, live_quota="auto", top_k=K)
    level = ex.controller.max_level if top else 0  # type: ignore[union-attr]  # the top: every miss to the CPU
    ex._apply_level(level)
    oracle = KnownRouting()
    ex.enable_prefetch(oracle, K)
    matches_resident_with_a_share(ex, bf16, oracle, seed=11)
    snap = ex.stats.snapshot()
    assert (len(calls) > 0) == (level > 0) and (snap["experts_cpu"] > 0) == (level > 0)
    ex.close()


def test_engine_tokens_with_prefetch(qwen3_ckpt) -> None:  # noqa: ANN001
    prompts = [[9707, 11, 1879], list(range(3000, 3020))]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="resident") as llm:
        want = [o.token_ids for o in llm.generate(prompts, greedy)]
    for routing in ("router", "synthetic:seed=1"):
        with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", expert_cache="device", moe_slots=8,
                 moe_prefetch="on", routing=routing) as llm:
            got = [o.token_ids for o in llm.generate(prompts, greedy)]
            moe = llm.stats()["moe"]
        if routing == "router":
            assert got == want
        assert moe["prefetch"] == ("router" if routing == "router" else "synthetic oracle")
        assert moe["prefetched"] > 0


def test_a_guess_of_lower_recall_changes_no_token_and_copies_unused_experts(qwen3_ckpt) -> None:  # noqa: ANN001
    """`--routing synthetic:recall=R`: prefetch copies a guess, not the draws; the tokens are
    the same routing's without prefetch, and some copied experts go unused."""
    prompts = [[9707, 11, 1879], list(range(3000, 3020))]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out, moe = {}, {}
    for prefetch in ("off", "on"):
        with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", expert_cache="device", moe_slots=8,
                 moe_prefetch=prefetch, routing="synthetic:seed=1,recall=0.5") as llm:
            out[prefetch] = [o.token_ids for o in llm.generate(prompts, greedy)]
            moe[prefetch] = llm.stats()["moe"]
    assert out["on"] == out["off"]
    assert moe["on"]["prefetch"] == "synthetic guess, recall 0.5"
    assert 0 < moe["on"]["prefetch_used"] < moe["on"]["prefetched"]


@pytest.mark.parametrize(("env", "slots", "stats"), [
    ({"EDGEMOE_PREFETCH_DEPTH": "2"}, 12, {"prefetch_depth": 2}),
    ({"EDGEMOE_PREFETCH_MIN_PROB": "0.2"}, 8, {"prefetch": "router, probability >= 0.2"}),
])
def test_engine_tokens_with_a_prefetch_setting(qwen3_ckpt, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                               env: dict[str, str], slots: int, stats: dict[str, object]) -> None:
    """Prefetch settings through the engine, the model's router predicting: two layers ahead
    (EDGEMOE_PREFETCH_DEPTH=2), or only its surer picks (EDGEMOE_PREFETCH_MIN_PROB: the -1 picks
    reach the plan). The greedy tokens stay the resident engine's."""
    prompts = [[9707, 11, 1879], list(range(3000, 3020))]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="resident") as llm:
        want = [o.token_ids for o in llm.generate(prompts, greedy)]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", expert_cache="device", moe_slots=slots,
             moe_prefetch="on") as llm:
        got = [o.token_ids for o in llm.generate(prompts, greedy)]
        moe = llm.stats()["moe"]
    assert got == want and moe["prefetched"] > 0
    assert {key: moe[key] for key in stats} == stats


def test_the_prefetch_depth_is_the_deepest_the_pool_holds_or_the_environments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.moe.prefetch import prefetch_depth

    monkeypatch.delenv("EDGEMOE_PREFETCH_DEPTH", raising=False)
    # depth + 1 layers' worth of the largest step's experts (128 at Qwen3-30B-A3B's shape)
    depths = [prefetch_depth(slots, 128) for slots in (100, 255, 256, 383, 384, 511, 512, 2558)]
    assert depths == [1, 1, 1, 1, 2, 2, 3, 3]
    monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", "2")
    assert prefetch_depth(2558, 128) == 2 and prefetch_depth(10, 128) == 2  # as set: `covers` still decides a step
    for bad in ("0", "4", "two"):
        monkeypatch.setenv("EDGEMOE_PREFETCH_DEPTH", bad)
        with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_DEPTH"):
            prefetch_depth(2558, 128)


def test_the_flag_is_refused_where_nothing_prefetches() -> None:
    for settings in (dict(expert_cache="host"), dict(moe_backend="cpu")):
        with pytest.raises(ValueError, match="moe-prefetch on"):
            EngineConfig.from_kwargs(moe_prefetch="on", **settings)
    EngineConfig.from_kwargs(moe_prefetch="on", moe_backend="hybrid")
    EngineConfig.from_kwargs(moe_prefetch="on", expert_mover="copy")  # the copier's, where it runs


def test_the_prefetch_mover_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefetch moves as the chain does unless EDGEMOE_PREFETCH_MOVER says otherwise: copy
    beside a gathering chain; a gather beside the copier's chain is refused by name (the side
    gather would run the chain's own mover), as is any other word."""
    from edgemoe.moe.movers import CopierMover, GatherMover
    from edgemoe.moe.side_copies import side_mover

    gather, copier = object.__new__(GatherMover), object.__new__(CopierMover)
    monkeypatch.delenv("EDGEMOE_PREFETCH_MOVER", raising=False)
    assert (side_mover(gather), side_mover(copier)) == ("gather", "copy")
    monkeypatch.setenv("EDGEMOE_PREFETCH_MOVER", "copy")
    assert (side_mover(gather), side_mover(copier)) == ("copy", "copy")
    monkeypatch.setenv("EDGEMOE_PREFETCH_MOVER", "gather")
    assert side_mover(gather) == "gather"
    with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_MOVER=gather: the chain moves by the copier"):
        side_mover(copier)
    monkeypatch.setenv("EDGEMOE_PREFETCH_MOVER", "dma")
    with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_MOVER='dma'"):
        side_mover(gather)


def test_a_mover_that_reads_the_host_refuses_prefetch() -> None:
    """The copy mover without the copier (no GPU here) reads each miss list back: nothing
    can run beside the chain, and the executor says so instead of prefetching wrong."""
    store = random_bank_store(2, 8, 16, 8, torch.bfloat16)
    ex = make_executor("offload", store, CPU, F.silu, 2, 6, expert_cache="device", expert_mover="copy")
    assert ex.mover.name == "copy" and not ex.mover.graph_safe
    with pytest.raises(ValueError, match="moe_prefetch"):
        ex.enable_prefetch(KnownRouting(), 2)


def test_the_side_gather_grid_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.kernels.gather_grid import BLOCK_INTO, GatherGrid
    from edgemoe.moe.prefetch import DEFAULT_PROGRAMS, prefetch_grid

    monkeypatch.delenv("EDGEMOE_PREFETCH_PROGRAMS", raising=False)
    monkeypatch.delenv("EDGEMOE_PREFETCH_TILE", raising=False)
    assert prefetch_grid() == GatherGrid(DEFAULT_PROGRAMS, BLOCK_INTO, 4)
    monkeypatch.setenv("EDGEMOE_PREFETCH_PROGRAMS", "64")
    monkeypatch.setenv("EDGEMOE_PREFETCH_TILE", "8192,8")
    assert prefetch_grid() == GatherGrid(64, 8192, 8)
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("EDGEMOE_PREFETCH_PROGRAMS", bad)
        with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_PROGRAMS"):
            prefetch_grid()
    monkeypatch.setenv("EDGEMOE_PREFETCH_PROGRAMS", "32")
    for bad in ("8192", "3000,4", "8192,3", "8192,64", "a,b", "8192,8,1"):
        monkeypatch.setenv("EDGEMOE_PREFETCH_TILE", bad)
        with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_TILE"):
            prefetch_grid()


def test_the_side_stream_priority_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.moe.prefetch import DEFAULT_PRIORITY, side_priority

    monkeypatch.delenv("EDGEMOE_PREFETCH_PRIORITY", raising=False)
    assert side_priority() == (-1 if DEFAULT_PRIORITY == "high" else 0)
    monkeypatch.setenv("EDGEMOE_PREFETCH_PRIORITY", "high")
    assert side_priority() == -1  # torch's streams: lower is higher
    monkeypatch.setenv("EDGEMOE_PREFETCH_PRIORITY", "normal")
    assert side_priority() == 0
    monkeypatch.setenv("EDGEMOE_PREFETCH_PRIORITY", "urgent")
    with pytest.raises(ValueError, match="EDGEMOE_PREFETCH_PRIORITY"):
        side_priority()


def test_router_predictor_ranks_as_each_router_does() -> None:
    """gpt-oss's logit bias, GLM's sigmoid scores plus selection bias and ERNIE's softmax
    probabilities plus selection bias change the ranking the next layer's router makes: the
    predictor ranks the same way (a plain weight: the logits alone)."""
    from edgemoe.moe.predictors import RouterScores

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(5, H, generator=g), torch.randn(E, H, generator=g) / H**0.5
    bias = 3 * torch.randn(E, generator=g)
    logits = x @ w.t()
    like = torch.full((5, K), -1, dtype=torch.int32)
    cases = {"plain": (w, logits), "gpt-oss": (RouterScores(w, bias), logits + bias),
             "glm": (RouterScores(w, bias, sigmoid=True), logits.sigmoid() + bias),
             "ernie": (RouterScores(w, bias / E, softmax=True), logits.softmax(-1) + bias / E)}
    picks = {}
    for name, (router, scores) in cases.items():
        got = RouterPredictor({0: router}, K)(0, x, like)
        assert torch.equal(got.long(), torch.topk(scores, K, dim=-1).indices), name
        picks[name] = got
    assert all(not torch.equal(picks["plain"], picks[name]) for name in ("gpt-oss", "glm", "ernie"))


@pytest.mark.parametrize("family", ["glm", "deepseek-v2", "ernie"])
def test_moe_block_hands_prefetch_its_ranking(family: str) -> None:
    """Each grouped router hands the executor the ranking its own selection makes: GLM's
    sigmoid plus bias, DeepSeek-V2's plain logits (a softmax without bias ranks as they do),
    ERNIE's softmax plus bias."""
    from edgemoe.kernels.router_sigmoid import GroupedSigmoid, SigmoidRouter
    from edgemoe.layers.moe import SparseMoE

    w, bias = torch.randn(E, H), torch.randn(E)
    spec = {"glm": GroupedSigmoid(1, 1, 1.0), "deepseek-v2": GroupedSigmoid(1, 1, 1.0, softmax=True, selection_bias=False),
            "ernie": GroupedSigmoid(1, 1, 1.0, softmax=True, norm_min=1e-12)}[family]
    got = {}
    executor = DeviceOffloadExecutor.__new__(DeviceOffloadExecutor)
    executor.routers, executor.routing = got, None
    SparseMoE(3, w, K, True, executor, sigmoid=SigmoidRouter(w, None if family == "deepseek-v2" else bias, spec))
    ranking = got[3]
    assert (ranking.sigmoid, ranking.softmax, ranking.bias is not None) == {
        "glm": (True, False, True), "deepseek-v2": (False, False, False), "ernie": (False, True, True)}[family]
