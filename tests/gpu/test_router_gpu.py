"""The router's kernels compiled, on the GPU: the top-k by ranks bit for bit the K rounds
of search it replaced (`_route_topk` and the fused router, bf16, Qwen3-30B-A3B's 128
experts and 256), the ids in the order of a stable sort of torch's softmax on logits with
exact ties; the router fused with the residual add + RMSNorm in front of it bit for bit
the pair of launches it replaces (`add_rms_norm`, then the fused router), eager and
replayed from a CUDA graph, and a model's greedy tokens and logits the same bits with
EDGEMOE_ROUTER_NORM on and off."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from router_support import check_routing, router_inputs, sorted_ids, tied_logits  # noqa: E402

from edgemoe.kernels.router import RouterWorkspace  # noqa: E402

Routed = tuple[torch.Tensor, torch.Tensor]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
BF16, CUDA = torch.bfloat16, torch.device("cuda")


def by_search(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Routed], *args: object) -> Routed:
    """fn(*args) with the top-k forced to the K rounds of search (another compiled kernel)."""
    from edgemoe.kernels.triton_ops import router

    with monkeypatch.context() as m:
        m.setattr(router, "RANK_MAX_E_PAD", 0)
        return fn(*args)


@pytest.mark.parametrize("E", [128, 256, 60])
@pytest.mark.parametrize("K", [8, 1, 10])  # 10: Qwen3.8's top-k, padded to 16
def test_route_topk_ranks_equal_search(monkeypatch: pytest.MonkeyPatch, E: int, K: int) -> None:
    from edgemoe.kernels.triton_ops import router

    g = torch.Generator(device=CUDA).manual_seed(E + K)
    for logits in (tied_logits(32, E, seed=E * K, device=CUDA), torch.randn(64, E, generator=g, device=CUDA).to(BF16)):
        for renorm in (True, False):
            ids, w = router.route_topk_triton(logits, K, renorm, BF16)
            want = by_search(monkeypatch, router.route_topk_triton, logits, K, renorm, BF16)
            assert torch.equal(ids, want[0]) and torch.equal(w, want[1])
    ties = tied_logits(32, E, seed=E * K, device=CUDA)
    assert torch.equal(router.route_topk_triton(ties, K, True, BF16)[0], sorted_ids(ties, K))


@pytest.mark.parametrize("tokens", [1, 8, 32])
@pytest.mark.parametrize("E", [128, 256])
def test_fused_router_ranks_equal_search(monkeypatch: pytest.MonkeyPatch, tokens: int, E: int) -> None:
    """At H = 2048, top-8; duplicated and zero router rows tie logits exactly."""
    from edgemoe.kernels.triton_ops import router

    x, w = router_inputs(tokens, E, 2048, BF16, seed=tokens + E, device=CUDA)
    w[E // 2 : E // 2 + 8] = w[3]
    w[-4:] = 0.0
    ws = RouterWorkspace.allocate(E, CUDA)
    ids, wts = router.route_logits_topk_triton(x, w, 8, True, BF16, ws.logits, ws.arrivals)
    logits = ws.logits[:tokens].clone()
    want = by_search(monkeypatch, router.route_logits_topk_triton, x, w, 8, True, BF16, ws.logits, ws.arrivals)
    assert torch.equal(ws.logits[:tokens], logits)
    assert torch.equal(ids, want[0]) and torch.equal(wts, want[1])
    assert torch.equal(ids, sorted_ids(logits, 8))
    assert not ws.arrivals.any()


# --- the router fused with the residual add + RMSNorm in front of it ---------------------


def norm_inputs(T: int, H: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """(attention output a, residual, norm weight, router weight [128, H])."""
    g = torch.Generator(device=CUDA).manual_seed(seed)
    a, w = router_inputs(T, 128, H, dtype, seed=seed, device=CUDA)
    residual = (torch.randn(T, H, generator=g, device=CUDA) * 2).to(dtype)
    weight = (torch.randn(H, generator=g, device=CUDA) * 0.3 + 1).to(dtype)
    return a, residual, weight, w


def fused_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from edgemoe.kernels.triton_ops import router as kernels

    calls: list[int] = []
    real = kernels.add_norm_route_triton
    monkeypatch.setattr(kernels, "add_norm_route_triton", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("H", [2048, 4096])  # Qwen3-30B-A3B (8 warps), Qwen3-235B (16)
@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_add_norm_route_is_the_pair_bitwise(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, offset: float, H: int, tokens: int
) -> None:
    """One launch, bit for bit `add_rms_norm`'s kernel then the fused router's from its x;
    h exactly the reference's, x within 2 ulps of it, the routing within the bound."""
    from edgemoe.kernels.norm_fused import add_rms_norm, add_rms_norm_ref
    from edgemoe.kernels.router import add_norm_route, route_logits_topk
    from edgemoe.layers.norm import OffsetRMSNorm, RMSNorm

    # The routing's reference logits: one rounding of an fp32 sum (`logit_bound`), not
    # cuBLAS's bf16 reduction of split-K partials.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)
    calls = fused_calls(monkeypatch)
    a, residual, weight, w = norm_inputs(tokens, H, dtype, seed=H + tokens)
    norm = (OffsetRMSNorm if offset else RMSNorm)(weight, 1e-6)
    ws = RouterWorkspace.allocate(128, CUDA)
    got = add_norm_route(a, residual, norm, w, 8, True, dtype, ws)
    assert calls == [1]
    logits = ws.logits[:tokens].clone()
    x, h = add_rms_norm(a, residual, weight, 1e-6, offset)
    ids, wts = route_logits_topk(x, w, 8, True, dtype, ws)
    assert torch.equal(got.h, h) and torch.equal(got.x, x)
    assert torch.equal(logits, ws.logits[:tokens]) and torch.equal(got.ids, ids) and torch.equal(got.weights, wts)
    ref_x, ref_h = add_rms_norm_ref(a, residual, weight, 1e-6, offset)
    # The fp32 sum of squares in another order than torch's moves the normalised value by
    # an fp32 ulp or two; rounded to the dtype twice (the cast, then x weight): 2 ulps.
    rel = 2 * torch.finfo(dtype).eps
    assert torch.equal(got.h, ref_h) and ((got.x.float() - ref_x.float()).abs() <= rel * ref_x.float().abs()).all()
    if dtype == BF16:
        check_routing(got.x, w, 8, True, got.ids, got.weights)
    assert not ws.arrivals.any()


def test_add_norm_route_replays_from_a_cuda_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.kernels.norm_fused import add_rms_norm
    from edgemoe.kernels.router import add_norm_route, route_logits_topk
    from edgemoe.layers.norm import RMSNorm

    calls = fused_calls(monkeypatch)
    a, residual, weight, w = norm_inputs(8, 2048, BF16, seed=1)
    norm, ws = RMSNorm(weight, 1e-6), RouterWorkspace.allocate(128, CUDA)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile off the graph
        add_norm_route(a, residual, norm, w, 8, True, BF16, ws)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = add_norm_route(a, residual, norm, w, 8, True, BF16, ws)
    for seed in (2, 3):  # fresh inputs in the captured buffers
        new_a, new_residual, _, _ = norm_inputs(8, 2048, BF16, seed=seed)
        a.copy_(new_a)
        residual.copy_(new_residual)
        graph.replay()
        torch.cuda.synchronize()
        got = [t.clone() for t in out]
        x, h = add_rms_norm(a, residual, weight, 1e-6)
        ids, wts = route_logits_topk(x, w, 8, True, BF16, ws)
        assert all(torch.equal(g, v) for g, v in zip(got, (x, h, ids, wts), strict=True))
    assert calls == [1, 1] and not ws.arrivals.any()  # warm-up and capture: the fused launch


PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0]]


@pytest.mark.parametrize("settings", [{"moe_backend": "resident"},
                                      {"moe_backend": "offload", "moe_slots": 8, "expert_cache": "device"}])
def test_model_bitwise_with_router_norm_on_and_off(
    small_ckpt: Path, monkeypatch: pytest.MonkeyPatch, settings: dict
) -> None:
    """Greedy tokens (decode in CUDA graphs: the fused launch) and prefill logits the same
    bits with EDGEMOE_ROUTER_NORM on and off."""
    from edgemoe import LLM, SamplingParams

    calls = fused_calls(monkeypatch)
    results = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("EDGEMOE_ROUTER_NORM", switch)
        calls.clear()
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", **settings) as llm:
            fused = sum(b.route_norm for b in llm.engine.runtime.model.blocks)
            greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
            tokens = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
            logits = llm.prompt_logits(PROMPTS[0] + tokens[0])
        results[switch] = (fused, tokens, logits, len(calls))
    on, off = results["1"], results["0"]
    assert on[0] > 0 and off[0] == 0 and on[3] > 0 and off[3] == 0
    assert on[1] == off[1]
    assert torch.equal(on[2], off[2])
