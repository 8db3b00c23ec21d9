"""The router's kernels compiled, on the GPU: the top-k by ranks bit for bit the K rounds
of search it replaced (`_route_topk` and the fused router, bf16, Qwen3-30B-A3B's 128
experts and 256), the ids in the order of a stable sort of torch's softmax on logits with
exact ties."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from router_support import router_inputs, sorted_ids, tied_logits  # noqa: E402

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
@pytest.mark.parametrize("K", [8, 1])
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
