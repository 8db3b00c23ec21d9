"""The router's top-k by ranks (`triton_ops/router.py` `_topk_by_rank`) under Triton's
interpreter: bit for bit the K rounds of search it replaced (`_topk_by_search`, forced by
RANK_MAX_E_PAD = 0), in `_route_topk` and the fused router, unchunked and in chunks; and
the ids against an independent order, a stable descending sort of torch's softmax, on
logits built with exact ties (equal logits, probabilities that underflow to 0, -inf)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import pytest
import torch
from router_support import router_inputs, sorted_ids, tied_logits

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
Routed = tuple[torch.Tensor, torch.Tensor]
pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def by_search(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Routed], *args: object) -> Routed:
    """fn(*args) with the top-k forced to the K rounds of search."""
    from edgemoe.kernels.triton_ops import router

    with monkeypatch.context() as m:
        m.setattr(router, "RANK_MAX_E_PAD", 0)
        return fn(*args)


def triton_pad(E: int) -> int:
    import triton

    return triton.next_power_of_2(E)


# (E, warps, the chunk rank_chunk gives): unchunked, in chunks, E not a power of two.
CASES = [(128, 8, 128), (128, 2, 32), (256, 8, 64), (60, 8, 64), (200, 8, 64), (7, 8, 8)]


@pytest.mark.parametrize(("E", "warps", "chunk"), CASES)
@pytest.mark.parametrize("K", [1, 2, 3, 4, 8, 10])  # 3, 10: padded to a power of two
def test_route_topk_by_rank_is_the_search_bitwise(
    monkeypatch: pytest.MonkeyPatch, E: int, warps: int, chunk: int, K: int
) -> None:
    from edgemoe.kernels.triton_ops import router

    if K > E:
        pytest.skip("K > E")
    monkeypatch.setattr(router, "TOPK_WARPS", warps)
    assert router.rank_chunk(triton_pad(E), warps) == chunk  # the path this case means to take
    x = tied_logits(6, E, seed=E * K + warps)
    for renorm in (True, False):
        ids, w = router.route_topk_triton(x, K, renorm, torch.bfloat16)
        want_ids, want_w = by_search(monkeypatch, router.route_topk_triton, x, K, renorm, torch.bfloat16)
        assert torch.equal(ids, want_ids) and torch.equal(w, want_w)
        assert torch.equal(ids, sorted_ids(x, K))
    # bf16 logits (what the projection gives): ties survive the cast
    ids, w = router.route_topk_triton(x.bfloat16(), K, True, torch.bfloat16)
    want_ids, want_w = by_search(monkeypatch, router.route_topk_triton, x.bfloat16(), K, True, torch.bfloat16)
    assert torch.equal(ids, want_ids) and torch.equal(w, want_w)


def test_rank_rule() -> None:
    """Ranks up to 256 experts within the comparisons' per-thread budget, else the search
    (Qwen3.8-Flash-Next's 512); chunks are powers of two that divide E_PAD."""
    from edgemoe.kernels.triton_ops import router

    assert router.rank_chunk(512, 8) == 0 and router.rank_chunk(256, 2) == 0
    for e_pad in (1, 8, 64, 128, 256):
        for warps in (1, 2, 4, 8, 16):
            chunk = router.rank_chunk(e_pad, warps)
            assert chunk == 0 or (e_pad % chunk == 0 and chunk & (chunk - 1) == 0)


# E = 256 and 2 warps: the unfused test above covers their chunking (the fused launch shares `_softmax_topk`).
@pytest.mark.parametrize(("E", "H", "K", "warps"), [(128, 64, 8, 8), (60, 40, 4, 8)])
def test_fused_router_by_rank_is_the_search_bitwise(
    monkeypatch: pytest.MonkeyPatch, E: int, H: int, K: int, warps: int
) -> None:
    """The fused launch (its last program routes): ranks and search bitwise; duplicated and
    zero router rows give exactly tied logits, which go to the lower id."""
    from edgemoe.kernels.router import RouterWorkspace
    from edgemoe.kernels.triton_ops import router

    monkeypatch.setattr(router, "NUM_WARPS", warps)
    assert router.rank_chunk(triton_pad(E), warps) > 0
    x, w = router_inputs(3, E, H, torch.bfloat16, seed=E + H)
    w[E // 2 : E // 2 + 8] = w[3]  # ties with expert 3 (the same fp32 sum, row for row)
    w[-4:] = 0.0  # logit 0, tied
    ws = RouterWorkspace.allocate(E, torch.device("cpu"), max_tokens=8)
    for renorm in (True, False):
        ids, wts = router.route_logits_topk_triton(x, w, K, renorm, torch.bfloat16, ws.logits, ws.arrivals)
        logits = ws.logits[:3].clone()
        want = by_search(monkeypatch, router.route_logits_topk_triton, x, w, K, renorm, torch.bfloat16,
                         ws.logits, ws.arrivals)
        assert torch.equal(ws.logits[:3], logits)
        assert torch.equal(ids, want[0]) and torch.equal(wts, want[1])
        assert torch.equal(ids, sorted_ids(logits, K))
    assert (logits[:, E // 2] == logits[:, 3]).all()  # the ties are real
    assert not ws.arrivals.any()


def test_top_k_above_the_experts_refused() -> None:
    from edgemoe.kernels.triton_ops import router

    with pytest.raises(ValueError, match="at most E"):
        router.route_topk_triton(torch.zeros(2, 4), 8, True, torch.bfloat16)
