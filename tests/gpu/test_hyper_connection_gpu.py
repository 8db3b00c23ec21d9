"""The hyper-connections' kernels compiled, on the GPU, at Qwen3.8-Flash-Next's shape (4
streams of 2048, rank 320): against the references (the injection bitwise, the rest within
a rounding of bf16), a whole mix through the layer against the layer's reference path, and
the same launches replayed from a CUDA graph bitwise their eager results."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgemoe.kernels import hyper_connection as hck
from edgemoe.kernels.norm_fused import grouped_rms_norm, grouped_rms_norm_ref
from edgemoe.layers.hyper_connection import HyperConnection

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
CUDA, BF16 = torch.device("cuda"), torch.bfloat16
HC, H, R, EPS = 4, 2048, 320, 1e-6


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=CUDA) * scale).to(BF16)


def within_rounding(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor | None = None) -> bool:
    """|got - want| within one bf16 rounding of `magnitude` (default: want's)."""
    mag = (want if magnitude is None else magnitude).float().abs()
    return bool(((got.float() - want.float()).abs() <= torch.finfo(BF16).eps * mag + 1e-30).all())


def max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    """The largest difference and where, for an assertion's message."""
    d = (got.float() - want.float()).abs()
    i = int(d.argmax())
    return f"max |diff| {float(d.flatten()[i]):.3g} at {i} (got {float(got.flatten()[i]):.6g}, want {float(want.flatten()[i]):.6g})"


def layer(seed: int = 0) -> HyperConnection:
    return HyperConnection(randn(HC * H, seed=seed, scale=0.1), randn(R + HC, HC * H, seed=seed + 1, scale=0.02),
                           randn(HC * H, R, seed=seed + 2, scale=0.05), HC, EPS)


@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_kernels_match_references(tokens: int) -> None:
    h, y, g = randn(tokens, HC * H, seed=1, scale=3.0), randn(tokens, H, seed=2), randn(tokens, HC, seed=3)
    w = randn(HC * H, seed=4, scale=0.3)
    n, h2 = hck.hc_norm(h, w, EPS, H, (y, g))
    want_n, want_h = hck.hc_norm_ref(h, w, EPS, H, (y, g))
    # One assertion a quantity, each saying by how much (2026-12-03: this test failed on the
    # H200 with the reasons cut from the log; the interpreter's versions pass).
    assert torch.equal(h2, want_h), f"injection: {(h2 != want_h).sum()} elements differ, {max_diff(h2, want_h)}"
    assert within_rounding(n, want_n), f"norm: {max_diff(n, want_n)}"
    assert torch.equal(hck.hc_inject(h, y, g), hck.hc_inject_ref(h, y, g)), "inject alone"
    assert within_rounding(grouped_rms_norm(h, w, EPS, H), grouped_rms_norm_ref(h, w, EPS, H))  # the PLE's norms
    z = randn(tokens, R + HC, seed=5, scale=4.0)
    (a, gg), (want_a, want_g) = hck.hc_gates(z, R, HC), hck.hc_gates_ref(z, R, HC)
    assert within_rounding(a, want_a), f"silu gate: {max_diff(a, want_a)}"
    assert within_rounding(gg, want_g), f"inject weights: {max_diff(gg, want_g)}"
    wp, nn = randn(tokens, HC * H, seed=6, scale=3.0), randn(tokens, HC * H, seed=7)
    mag = (torch.sigmoid(wp.float()) * nn.float()).abs().view(tokens, HC, H).mean(1)
    got, want = hck.hc_mix(wp, nn, HC), hck.hc_mix_ref(wp, nn, HC)
    assert within_rounding(got, want, 2 * mag), f"mix: {max_diff(got, want)}"


def test_layer_mix_against_its_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer's mix with the kernels against the same layer on the torch references
    (`use_triton` off): the input x within a few bf16 roundings (three rounded steps and two
    GEMVs on rounded inputs), g within one, the streams bitwise."""
    hcl = layer()
    h, y, g = randn(4, HC * H, seed=8, scale=2.0), randn(4, H, seed=9), randn(4, HC, seed=10).abs()
    x, gk, hk = hcl.mix(h, inject=(y, g))
    with monkeypatch.context() as m:
        m.setattr(hck, "use_triton", lambda *a, **k: False)
        want_x, want_g, want_h = hcl.mix(h, inject=(y, g))
    assert torch.equal(hk, want_h), f"streams: {max_diff(hk, want_h)}"
    assert ((x.float() - want_x.float()).abs() <= 8 * torch.finfo(BF16).eps * want_x.float().abs().amax()).all(), \
        f"x: {max_diff(x, want_x)}"
    assert ((gk.float() - want_g.float()).abs() <= 2 * torch.finfo(BF16).eps * 2).all(), f"g: {max_diff(gk, want_g)}"


def test_mix_replays_from_a_cuda_graph() -> None:
    hcl = layer(seed=20)
    h, y, g = randn(1, HC * H, seed=21), randn(1, H, seed=22), randn(1, HC, seed=23)
    eager = hcl.mix(h, inject=(y, g))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        hcl.mix(h, inject=(y, g))  # warm: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = hcl.mix(h, inject=(y, g))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        assert torch.equal(got, want)
