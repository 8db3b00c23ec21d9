"""The MoE router fused with the residual add + RMSNorm in front of it
(`kernels/router.py` `add_norm_route`): the kernel under Triton's interpreter bit for bit
the pair of kernels it replaces (`add_rms_norm`'s, then the fused router's from that x),
and against the references (`add_rms_norm_ref`, the routing's bound); the dispatch (where
it fuses, where the pair runs); `SparseMoE.add_norm_route` with the routing override; a
tiny qwen3_moe model's greedy tokens and logits bitwise the same with EDGEMOE_ROUTER_NORM
on and off, on the torch path and with the interpreted kernels."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from router_support import check_routing, router_inputs

from edgemoe import LLM, SamplingParams
from edgemoe.kernels import norm_fused
from edgemoe.kernels import router as router_mod
from edgemoe.kernels.backend import FAST_DTYPES
from edgemoe.kernels.dense_gemv import dense_gemv_ref
from edgemoe.kernels.norm_fused import add_rms_norm_ref
from edgemoe.kernels.router import RouterWorkspace, add_norm_route, add_norm_route_ref
from edgemoe.layers.moe import SparseMoE
from edgemoe.layers.norm import OffsetRMSNorm, RMSNorm

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
CPU = torch.device("cpu")
EPS = 1e-6


def inputs(T: int, E: int, H: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """(attention output a, residual, norm weight, router weight): a, residual ~ N(0, 1-4)."""
    g = torch.Generator().manual_seed(seed)
    a, w = router_inputs(T, E, H, dtype, seed)
    residual = (torch.randn(T, H, generator=g) * 2).to(dtype)
    weight = (torch.randn(H, generator=g) * 0.3 + 1).to(dtype)
    return a, residual, weight, w


def norm_tolerance(want: torch.Tensor) -> torch.Tensor:
    """The kernel's fp32 sum of squares runs in another order than torch's: its last bits
    move the normalised value by an fp32 ulp or two, which the two roundings to the dtype
    (the cast, then x weight) can turn into 2 ulps of the dtype (fp32: a few ulps, 1e-6)."""
    rel = {torch.float32: 1e-6, torch.bfloat16: 2 * 2**-7, torch.float16: 2 * 2**-10}[want.dtype]
    return rel * want.float().abs() + 1e-30


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize(("T", "E", "K", "H"), [(3, 16, 4, 96), (2, 8, 2, 4100)])  # masked tail; 3 loads along H
def test_fused_kernel_is_the_pair_bitwise(dtype: torch.dtype, offset: float, T: int, E: int, K: int, H: int) -> None:
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton
    from edgemoe.kernels.triton_ops.router import (
        add_norm_route_triton,
        route_logits_topk_triton,
    )

    a, residual, weight, w = inputs(T, E, H, dtype, seed=T * E + H)
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=4)
    x, h, ids, wts = add_norm_route_triton(a, residual, weight, EPS, offset, w, K, True, dtype, ws.logits, ws.arrivals)
    logits = ws.logits[:T].clone()
    want_x, want_h = rms_norm_triton(a, residual, weight, EPS, offset)
    want_ids, want_w = route_logits_topk_triton(want_x, w, K, True, dtype, ws.logits, ws.arrivals)
    assert torch.equal(h, want_h) and torch.equal(x, want_x)
    assert torch.equal(logits, ws.logits[:T]) and torch.equal(ids, want_ids) and torch.equal(wts, want_w)
    assert not ws.arrivals.any()
    # Not vacuous: against the references (h exact torch semantics; x to one rounding, the
    # sum of squares in another order; the routing of x within the logits' bound).
    ref_x, ref_h = add_rms_norm_ref(a, residual, weight, EPS, offset)
    assert torch.equal(h, ref_h)
    assert ((x.float() - ref_x.float()).abs() <= norm_tolerance(ref_x)).all()
    check_routing(x, w, K, True, ids, wts)


@needs_triton
def test_fused_kernel_leaves_its_inputs_and_writes_new_rows() -> None:
    """h and x are fresh tensors (every program reads residual and a while program 0
    writes: an alias would feed a program the new h); strided inputs are taken as rows."""
    from edgemoe.kernels.triton_ops.router import add_norm_route_triton

    T, E, H = 3, 16, 64
    a, residual, weight, w = inputs(T, E, 2 * H, torch.bfloat16, seed=7)
    a, residual, w = a[:, ::2], residual[:, :H], w[:, :H]  # strided / sliced views
    a_before, r_before = a.clone(), residual.clone()
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=4)
    x, h, ids, wts = add_norm_route_triton(a, residual, weight[:H], EPS, 0.0, w, 4, False, torch.bfloat16,
                                           ws.logits, ws.arrivals)
    want = add_norm_route(a.contiguous(), residual.contiguous(), RMSNorm(weight[:H].contiguous(), EPS), w, 4, False,
                          torch.bfloat16)  # CPU tensors: the pair of references
    assert torch.equal(a, a_before) and torch.equal(residual, r_before)
    assert torch.equal(h, want.h) and h.data_ptr() not in (a.data_ptr(), residual.data_ptr())
    assert ((x.float() - want.x.float()).abs() <= norm_tolerance(want.x)).all()
    check_routing(x, w, 4, False, ids, wts)
    empty = add_norm_route_triton(a[:0], residual[:0], weight[:H], EPS, 0.0, w, 4, False, torch.bfloat16,
                                  ws.logits, ws.arrivals)
    assert [t.shape[0] for t in empty] == [0, 0, 0, 0]


# --- dispatch ------------------------------------------------------------------------


@pytest.mark.parametrize("norm_cls", [RMSNorm, OffsetRMSNorm])
def test_dispatcher_is_the_references_on_the_torch_path(norm_cls: type[RMSNorm]) -> None:
    a, residual, weight, w = inputs(3, 16, 96, torch.bfloat16, seed=5)
    norm = norm_cls(weight, EPS)
    ws = RouterWorkspace.allocate(16, CPU, max_tokens=4)
    got = add_norm_route(a, residual, norm, w, 4, True, torch.bfloat16, ws)  # CPU tensors: no Triton
    want = add_norm_route_ref(a, residual, norm, w, 4, True, torch.bfloat16)
    assert all(torch.equal(g, v) for g, v in zip(got, want, strict=True))
    assert not ws.logits.any()  # the fused launch did not run


def triton_everywhere(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The router's and the norm's dispatchers take their Triton kernels on CPU tensors
    (the interpreter); returns the log of which fused router launch ran."""
    from edgemoe.kernels.triton_ops import router as kernels

    monkeypatch.setattr(router_mod, "use_triton", lambda t, dtype=None: (dtype or t.dtype) in FAST_DTYPES)
    monkeypatch.setattr(norm_fused, "use_triton", lambda t, dtype=None: (dtype or t.dtype) in FAST_DTYPES)
    calls: list[str] = []
    fused, plain = kernels.add_norm_route_triton, kernels.route_logits_topk_triton
    monkeypatch.setattr(kernels, "add_norm_route_triton", lambda *a: calls.append("fused") or fused(*a))
    monkeypatch.setattr(kernels, "route_logits_topk_triton", lambda *a: calls.append("plain") or plain(*a))
    return calls


@needs_triton
def test_dispatch_fuses_where_the_fused_router_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace and a batch that fits it: one launch; more tokens, a norm weight in
    another dtype, or no workspace: add_rms_norm, then the router."""
    calls = triton_everywhere(monkeypatch)
    E, H, K = 16, 64, 4
    ws = RouterWorkspace.allocate(E, CPU, max_tokens=4)
    for T, weight_dtype, workspace, want in [(4, torch.bfloat16, ws, ["fused"]), (5, torch.bfloat16, ws, []),
                                             (3, torch.float32, ws, ["plain"]), (3, torch.bfloat16, None, [])]:
        a, residual, weight, w = inputs(T, E, H, torch.bfloat16, seed=T)
        calls.clear()
        got = add_norm_route(a, residual, RMSNorm(weight.to(weight_dtype), EPS), w, K, True, torch.bfloat16, workspace,
                             dense_gemv_ref)
        assert calls == want, (T, weight_dtype)
        x, h = norm_fused.add_rms_norm(a, residual, weight.to(weight_dtype), EPS)  # the pair's first launch
        assert torch.equal(got.h, h) and torch.equal(got.x, x)
        want = router_mod.route_logits_topk(x, w, K, True, torch.bfloat16, workspace, dense_gemv_ref)
        assert torch.equal(got.ids, want[0]) and torch.equal(got.weights, want[1])


@needs_triton
def test_sparse_moe_add_norm_route_keeps_the_override_and_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The routing override replaces the ids (the router's weights stay); the trace
    records the ids the experts get, once a layer."""
    triton_everywhere(monkeypatch)
    E, H, K, T = 16, 32, 4, 3
    a, residual, weight, w = inputs(T, E, H, torch.bfloat16, seed=9)
    recorded: list[torch.Tensor] = []
    executor = SimpleNamespace(routing=None, trace=SimpleNamespace(record=lambda layer, ids: recorded.append(ids)),
                               forward=lambda layer, x, ids, weights, *rest: (ids, weights),
                               register_router=lambda layer, router, bias=None, **ranking: None)
    moe = SparseMoE(0, w, K, True, executor, dense_gemv_ref)  # type: ignore[arg-type]
    out = moe.add_norm_route(a, residual, RMSNorm(weight, EPS))
    assert moe.workspace is not None and moe.workspace.logits[:T].any()  # the fused launch ran
    want = add_norm_route(a, residual, RMSNorm(weight, EPS), w, K, True, torch.bfloat16, moe.workspace)
    assert all(torch.equal(g, v) for g, v in zip(out, want, strict=True))
    ids, _ = moe(out.x, out.h, routing=(out.ids, out.weights))
    assert torch.equal(ids, out.ids) and len(recorded) == 1 and torch.equal(recorded[0], out.ids)
    forced = torch.arange(T * K, dtype=torch.int64).reshape(T, K) % E
    executor.routing = SimpleNamespace(ids=lambda layer, router_ids: forced)
    over = moe.add_norm_route(a, residual, RMSNorm(weight, EPS))
    assert over.ids.dtype == torch.int32 and torch.equal(over.ids, forced.int())
    assert torch.equal(over.weights, out.weights) and torch.equal(over.x, out.x)


# --- a model, switch on and off --------------------------------------------------------


@pytest.mark.parametrize("kernels", ["torch", pytest.param("interpreter", marks=needs_triton)])
def test_tiny_model_bitwise_with_router_norm_on_and_off(
    make_ckpt: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, kernels: str
) -> None:
    # Layer 1 dense (mlp_only_layers): its block keeps the add + norm kernel. Prefill (every
    # position's logits) and decode (greedy continuation) both route through the blocks.
    path = str(make_ckpt("qwen3_moe", mlp_only_layers=[1], num_hidden_layers=3))
    calls = triton_everywhere(monkeypatch) if kernels == "interpreter" else []
    prompt, results = [5, 6, 7, 8, 9], {}
    for switch in ("1", "0"):
        monkeypatch.setenv("EDGEMOE_ROUTER_NORM", switch)
        calls.clear()
        with LLM(path, dtype="bfloat16") as llm:
            model = llm.engine.runtime.model
            fused = [b.route_norm for b in model.blocks]
            out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
            results[switch] = (llm.prompt_logits(prompt + out.token_ids), out.token_ids, fused, list(calls))
    on, off = results["1"], results["0"]
    assert on[2] == [True, False, True] and off[2] == [False, False, False]
    if kernels == "interpreter":  # which launches ran: the fused one only with the switch on
        assert "fused" in on[3] and "fused" not in off[3] and "plain" in off[3]
    assert on[1] == off[1]
    assert torch.equal(on[0], off[0])


@needs_triton
def test_hybrid_model_bitwise_with_router_norm_on_and_off(
    make_ckpt: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen3.5's hybrid blocks (zero-centred norms, a shared expert beside the routed ones)
    take the fused launch too, with the same tokens and logits as the pair."""
    path = str(make_ckpt("qwen3_5_moe"))
    calls = triton_everywhere(monkeypatch)
    prompt, results = [5, 6, 7, 8, 9], {}
    for switch in ("1", "0"):
        monkeypatch.setenv("EDGEMOE_ROUTER_NORM", switch)
        calls.clear()
        with LLM(path, dtype="bfloat16") as llm:
            fused = [b.route_norm for b in llm.engine.runtime.model.blocks]
            out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
            results[switch] = (llm.prompt_logits(prompt + out.token_ids), out.token_ids, fused, list(calls))
    on, off = results["1"], results["0"]
    assert all(on[2]) and not any(off[2])
    assert "fused" in on[3] and "fused" not in off[3]
    assert on[1] == off[1]
    assert torch.equal(on[0], off[0])
