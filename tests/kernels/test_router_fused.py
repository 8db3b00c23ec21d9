"""The fused router (`route_logits_topk`: the router's projection and softmax/top-k in one
Triton launch) under the interpreter against its reference, `F.linear` then
`route_topk_ref`; the workspace's arrival counters across calls and layers; the dispatch
in `route_logits_topk` and `SparseMoE.route` (`--dense-kernel`, the routing override)."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from router_support import check_routing, logit_bound, planted
from router_support import router_inputs as inputs
from tolerances import eps

from edgemoe.kernels import router as router_mod
from edgemoe.kernels.dense_gemv import dense_gemv_ref
from edgemoe.kernels.router import (
    RouterWorkspace,
    fused_router_workspace,
    route_logits_topk,
    route_logits_topk_ref,
    route_topk_ref,
)
from edgemoe.layers.moe import SparseMoE

# tests/kernels/conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable. Not
# `from conftest import INTERPRET`: which conftest that finds depends on the collection order.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None

needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
CPU = torch.device("cpu")


def fused(
    x: torch.Tensor, w: torch.Tensor, k: int, renorm: bool, ws: RouterWorkspace
) -> tuple[torch.Tensor, torch.Tensor]:
    from edgemoe.kernels.triton_ops.router import route_logits_topk_triton

    return route_logits_topk_triton(x, w, k, renorm, x.dtype, ws.logits, ws.arrivals)


@needs_triton
@pytest.mark.parametrize(
    "T,E,K,H,dtype,renorm",
    [
        (1, 128, 8, 2048, torch.bfloat16, True),  # Qwen3-30B-A3B, batch 1
        (6, 128, 8, 2048, torch.bfloat16, True),
        (2, 128, 8, 2048, torch.float32, False),
        (32, 12, 4, 40, torch.bfloat16, False),  # a full workspace
        (9, 60, 4, 200, torch.bfloat16, False),  # E and H not powers of two
        (9, 60, 4, 200, torch.float32, True),
        (5, 7, 1, 33, torch.bfloat16, True),  # K = 1: the weight renormalises to 1
        (7, 20, 2, 96, torch.float16, False),
        (2, 8, 2, 4100, torch.bfloat16, True),  # H > MAX_BLOCK_H: three loads along H, the last masked
        (2, 512, 10, 256, torch.bfloat16, True),  # Qwen3.8's top-10 of 512: K padded to 16, the search
        (3, 60, 6, 40, torch.bfloat16, False),  # K padded to 8, by ranks
    ],
)
def test_fused_matches_reference(T: int, E: int, K: int, H: int, dtype: torch.dtype, renorm: bool) -> None:
    x, w = inputs(T, E, H, dtype, seed=T + E + H)
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=32)
    ids, wts = fused(x, w, K, renorm, ws)
    # The workspace holds the logits: F.linear's within the bound (and exactly x's dtype's values).
    ref = F.linear(x, w).float()
    assert (ws.logits[:T] == ws.logits[:T].to(dtype).float()).all()
    assert ((ws.logits[:T] - ref).abs() <= logit_bound(x, w, ref)).all()
    check_routing(x, w, K, renorm, ids, wts)
    assert not ws.arrivals.any()  # every token's counter reset by its last program


@needs_triton
def test_fused_planted_logits_exact() -> None:
    """Exact logits at the real shape: the ids are the reference's exactly, the logits
    bitwise, the weights within a rounding of bf16 (torch's exp is not Triton's)."""
    T, E, K, H = 8, 128, 8, 2048
    x, w, L = planted(T, E, H, seed=3)
    assert torch.equal(F.linear(x, w).float(), L)  # the construction is exact
    ws = RouterWorkspace.allocate(E, CPU)
    ids, wts = fused(x, w, K, True, ws)
    want_ids, want_w = route_topk_ref(L.bfloat16(), K, True, torch.bfloat16)
    assert torch.equal(ws.logits[:T], L) and torch.equal(ids, want_ids)
    # fp32 softmax with another exp: a rounding of bf16 apart at most (2^-8 relative).
    assert ((wts - want_w).abs() <= eps(torch.bfloat16) / 2 * want_w).all()


@needs_triton
def test_same_logits_same_routing_as_route_topk() -> None:
    """The fused kernel and `route_topk`'s kernel share the routing helper: fed the fused
    launch's own logits, `_route_topk` returns its ids and weights bitwise."""
    from edgemoe.kernels.triton_ops.router import route_topk_triton

    x, w = inputs(6, 20, 200, torch.bfloat16, seed=5)
    ws = RouterWorkspace.allocate(20, CPU)
    for renorm in (True, False):
        ids, wts = fused(x, w, 4, renorm, ws)
        ids2, wts2 = route_topk_triton(ws.logits[:6].bfloat16(), 4, renorm, torch.bfloat16)
        assert torch.equal(ids, ids2) and torch.equal(wts, wts2)


@needs_triton
def test_counters_reset_across_calls_and_layers() -> None:
    """One workspace, layer A, layer B, A again, then B on fewer tokens: each call equals
    a run on a fresh workspace (a counter left over would make the wrong program route)."""
    T, E, K, H = 4, 20, 4, 64
    x, wa = inputs(T, E, H, torch.bfloat16, seed=11)
    _, wb = inputs(T, E, H, torch.bfloat16, seed=12)
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=8)
    got = [fused(x, wa, K, True, ws), fused(x, wb, K, True, ws), fused(x, wa, K, True, ws), fused(x[:3], wb, K, True, ws)]
    for (ids, wts), (xx, w) in zip(got, [(x, wa), (x, wb), (x, wa), (x[:3], wb)], strict=True):
        want_ids, want_w = fused(xx, w, K, True, RouterWorkspace.allocate(E, CPU, max_tokens=8))
        assert torch.equal(ids, want_ids) and torch.equal(wts, want_w)
    assert not torch.equal(got[0][0], got[1][0])  # the two layers route differently
    assert not ws.arrivals.any()


@needs_triton
def test_the_last_arrival_routes_whichever_program_it_is() -> None:
    """The interpreter runs programs in grid order, so the last block always arrives last
    there; on a GPU any may. Counters preset to 1 (as if one program per token had
    arrived) make the next-to-last block complete the count: it must route from the
    workspace, where the last block's logits are still the planted +50 (not yet written),
    and reset the counter, which the last program's arrival then takes to 1."""
    from edgemoe.kernels.triton_ops.router import BLOCK_E

    T, E, H = 3, 15 * BLOCK_E, 96
    K = BLOCK_E  # a power of two: the last block's experts are the top K when planted
    last = range(E - BLOCK_E, E)
    x, w = inputs(T, E, H, torch.bfloat16, seed=4)
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=4)
    ws.logits[:, last.start:] = 50.0
    ws.arrivals[:T] = 1
    ids, wts = fused(x, w, K, True, ws)
    assert torch.equal(ids, torch.tensor([list(last)] * T, dtype=torch.int32))
    assert torch.equal(wts, torch.full((T, K), 1 / K))  # K equal logits (the rest ~e^-50)
    assert ws.arrivals.tolist() == [1] * T + [0]


# --- dispatch ------------------------------------------------------------------------


def test_no_workspace_without_triton_gpu() -> None:
    """On the CPU the router keeps the projection + top-k."""
    _, w = inputs(1, 16, 32, torch.bfloat16, seed=0)
    assert fused_router_workspace(w, 4) is None  # CPU tensor: no Triton path
    x, _ = inputs(3, 16, 32, torch.bfloat16, seed=1)
    ids, wts = route_logits_topk(x, w, 4, True, torch.bfloat16)
    want = route_logits_topk_ref(x, w, 4, True, torch.bfloat16)
    assert torch.equal(ids, want[0]) and torch.equal(wts, want[1])


@pytest.fixture
def triton_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the router's dispatchers take the Triton paths on CPU tensors (interpreter)."""
    monkeypatch.setattr(router_mod, "use_triton", lambda t, dtype=None: True)


@needs_triton
def test_workspace_wherever_triton_runs(triton_on_cpu: None) -> None:
    """Whatever --dense-kernel says (the layer's linear is not consulted), whatever top-k
    (a K that is not a power of two is padded inside the kernel: Qwen3.8's 10)."""
    _, w = inputs(1, 16, 32, torch.bfloat16, seed=0)
    for k in (3, 4):
        ws = fused_router_workspace(w, k)
        assert ws is not None and ws.logits.shape == (router_mod.FUSED_MAX_TOKENS, 16) and not ws.arrivals.any()


@needs_triton
def test_dispatch_by_token_count(triton_on_cpu: None) -> None:
    """Up to the workspace's tokens: the fused launch (its logits land in the workspace, the
    linear is not called); beyond: linear, then top-k."""
    E, H, K = 16, 32, 4
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=4)
    calls: list[int] = []

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return F.linear(x, w)

    for T in (4, 5):
        x, w = inputs(T, E, H, torch.bfloat16, seed=T)
        ws.logits.zero_()
        ids, wts = route_logits_topk(x, w, K, True, torch.bfloat16, ws, linear)
        check_routing(x, w, K, True, ids, wts)
        assert ws.logits.any() == (T == 4)
    assert calls == [5]


@needs_triton
def test_sparse_moe_route_fused_and_override(triton_on_cpu: None) -> None:
    """SparseMoE routes through the fused launch under --dense-kernel torch too (its default
    linear); the routing override (cache studies) still replaces the ids and keeps the
    router's weights."""
    E, H, K, T = 16, 32, 4, 3
    x, w = inputs(T, E, H, torch.bfloat16, seed=9)
    executor = SimpleNamespace(routing=None, register_router=lambda layer, router, bias=None, **ranking: None)
    moe = SparseMoE(0, w, K, True, executor, dense_gemv_ref)  # type: ignore[arg-type]
    assert moe.workspace is not None
    ids, wts = moe.route(x)
    assert moe.workspace.logits[:T].any()  # the fused path ran
    check_routing(x, w, K, True, ids, wts)
    forced = torch.arange(T * K, dtype=torch.int64).reshape(T, K) % E
    executor.routing = SimpleNamespace(ids=lambda layer, router_ids: forced)
    ids2, wts2 = moe.route(x)
    assert ids2.dtype == torch.int32 and torch.equal(ids2, forced.int()) and torch.equal(wts2, wts)


@needs_triton
def test_router_bias_enters_before_the_rounding() -> None:
    """gpt-oss's router bias: the fused launch's logits are round(x·Wᵀ + b) to x's dtype,
    F.linear(x, W, b)'s (exact logits planted, so bitwise), routed as the reference routes
    them; and the bias moves the routing (not vacuous). The torch path is F.linear's."""
    T, E, K, H = 4, 16, 4, 512
    x, w, L = planted(T, E, H, seed=7)  # L: a permutation of -8..7, times 2^-4, a token
    # A permutation of 0..15 (L's spread each step): every biased logit distinct (no ties)
    # and bf16-exact (at most 247 · 2^-4: 8 significant bits).
    b = torch.randperm(E, generator=torch.Generator().manual_seed(7)).bfloat16()
    ws = RouterWorkspace.allocate(E, CPU)
    from edgemoe.kernels.triton_ops.router import route_logits_topk_triton

    ids, wts = route_logits_topk_triton(x, w, K, True, torch.bfloat16, ws.logits, ws.arrivals, b)
    want_logits = (L + b.float()).bfloat16()
    assert torch.equal(ws.logits[:T], want_logits.float())
    want_ids, want_w = route_topk_ref(want_logits, K, True, torch.bfloat16)
    assert torch.equal(ids, want_ids)
    assert ((wts - want_w).abs() <= eps(torch.bfloat16) / 2 * want_w).all()
    assert not torch.equal(ids, route_topk_ref(L.bfloat16(), K, True, torch.bfloat16)[0])
    torch_ids, _ = route_logits_topk(x, w, K, True, torch.bfloat16, None, dense_gemv_ref, b)
    assert torch.equal(torch_ids, route_logits_topk_ref(x, w, K, True, torch.bfloat16, b)[0])
    assert torch.equal(torch_ids, want_ids)
