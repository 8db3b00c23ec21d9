"""Hyper-connections: the layer (its references) against transformers' `Qwen4ExpTextGatedResidual`,
and the Triton kernels (interpreter on CPU) against the references."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.hyper_connection import hc_gates_ref, hc_inject_ref, hc_mix_ref, hc_norm_ref
from edgemoe.layers.hyper_connection import HyperConnection

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
HC, H, R, EPS = 4, 96, 20, 1e-6


def randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def one_rounding(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within one rounding of the dtype of each other (relative, plus the dtype's tiny). In
    fp32 the output's rounding doesn't hide the fp32 ops' own errors (an exp, a division, a
    sum in another order: a few units in the last place each): 8 of them."""
    eps = torch.finfo(want.dtype).eps * (8 if want.dtype == torch.float32 else 1)
    tiny = torch.finfo(want.dtype).tiny
    return bool(((got.float() - want.float()).abs() <= eps * want.float().abs() + tiny).all())


@pytest.mark.parametrize("inject", [True, False])
def test_layer_matches_transformers(inject: bool) -> None:
    mod = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
    cfg = mod.Qwen4ExpTextConfig(hidden_size=H, hc_count=HC, hc_lowrank=R, rms_norm_eps=EPS)
    ref = mod.Qwen4ExpTextGatedResidual(cfg, use_combine=inject).to(torch.bfloat16)
    with torch.no_grad():
        for i, p in enumerate(ref.parameters()):
            p.copy_(randn(*p.shape, seed=i, scale=0.2))
        down = ref.input_mix_weight_down.weight
        if inject:
            down = torch.cat([down, ref.block_inject_weight.weight])
        layer = HyperConnection(ref.hc_norm.weight, down, ref.input_mix_weight_up.weight, HC, EPS)
        h = randn(3, HC * H, seed=9, scale=2.0)
        x, g, h_out = layer.mix(h)
        want = ref(h)
    if inject:
        assert torch.equal(x, want[0]) and torch.equal(h_out, want[1]) and torch.equal(g, want[2])
    else:
        assert torch.equal(x, want) and g is None and h_out is h


def test_mix_with_an_injection_is_inject_then_mix() -> None:
    """`mix(h, inject=(y, g))` is `mix(inject(h, y, g))`, the streams returned the sum."""
    layer = HyperConnection(randn(HC * H, seed=1, scale=0.1), randn(R + HC, HC * H, seed=2, scale=0.1),
                            randn(HC * H, R, seed=3, scale=0.1), HC, EPS)
    h, y, g = randn(2, HC * H, seed=4), randn(2, H, seed=5), randn(2, HC, seed=6).abs()
    got = layer.mix(h, inject=(y, g))
    summed = HyperConnection.inject(h, y, g)
    want = layer.mix(summed)
    assert torch.equal(got[2], summed) and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


DTYPES = [torch.bfloat16, torch.float32]


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 100])  # 100: a masked tail
def test_norm_and_inject_kernel(dtype: torch.dtype, hidden: int) -> None:
    from edgemoe.kernels.triton_ops.hyper_connection import hc_norm_triton

    h, w = randn(3, HC * hidden, seed=1, scale=3.0, dtype=dtype), randn(HC * hidden, seed=2, scale=0.3, dtype=dtype)
    y, g = randn(3, hidden, seed=3, dtype=dtype), randn(3, HC, seed=4, dtype=dtype)
    n, h_out = hc_norm_triton(h, w, EPS, hidden, None)
    want_n, _ = hc_norm_ref(h, w, EPS, hidden)
    assert h_out is h and one_rounding(n, want_n)
    n, h_out = hc_norm_triton(h, w, EPS, hidden, (y, g))
    want_n, want_h = hc_norm_ref(h, w, EPS, hidden, (y, g))
    assert torch.equal(h_out, want_h) and one_rounding(n, want_n)  # the injection: a product and a sum, bitwise
    _, injected = hc_norm_triton(h, None, 0.0, hidden, (y, g), norm=False)
    assert torch.equal(injected, hc_inject_ref(h, y, g))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inject", [True, False])
def test_gates_kernel(dtype: torch.dtype, inject: bool) -> None:
    from edgemoe.kernels.triton_ops.hyper_connection import hc_gates_triton

    z = randn(3, R + (HC if inject else 0), seed=5, scale=4.0, dtype=dtype)
    a, g = hc_gates_triton(z, R, HC)
    want_a, want_g = hc_gates_ref(z, R, HC)
    assert one_rounding(a, want_a)
    assert (g is None) == (want_g is None) and (g is None or one_rounding(g, want_g))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 1100])  # 1100: two column blocks, the second masked
def test_mix_kernel(dtype: torch.dtype, hidden: int) -> None:
    from edgemoe.kernels.triton_ops.hyper_connection import hc_mix_triton

    w, n = randn(2, HC * hidden, seed=6, scale=3.0, dtype=dtype), randn(2, HC * hidden, seed=7, dtype=dtype)
    x = hc_mix_triton(w, n, HC)
    want = hc_mix_ref(w, n, HC)
    # The sigmoid's exp and division are Triton's: each product within a rounding, so the mean too
    # (relative to the streams' magnitude, not the mean's, which may cancel).
    bound = torch.finfo(dtype).eps * (8 if dtype == torch.float32 else 2) * (torch.sigmoid(w.float()) * n.float()).abs().view(2, HC, -1).mean(1)
    assert ((x.float() - want.float()).abs() <= bound + torch.finfo(dtype).tiny).all()
