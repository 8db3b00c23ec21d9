"""The GDN decode step's one-launch pieces compiled, on the GPU, at Qwen3.5 / Qwen3.8's GDN
shape (16 key / 32 value heads × 128; 8,192 conv channels): the conv update (bitwise the
reference, its pool rows too), the gated norm (within a rounding of bf16) and the gates (g
within a few fp32 ulps, beta within a rounding of bf16) against the torch references, and
the three replayed from a CUDA graph bitwise their eager results."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgemoe.kernels.causal_conv import causal_conv1d_update, causal_conv1d_update_ref
from edgemoe.kernels.gated_norm import gated_rms_norm, gated_rms_norm_ref
from edgemoe.kernels.gdn import gdn_gates, gdn_gates_ref

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
CUDA, BF16 = torch.device("cuda"), torch.bfloat16
HV, DV, CHANNELS, TAPS = 32, 128, 8192, 4


def randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = BF16) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=CUDA) * scale).to(dtype)


@pytest.mark.parametrize("batch", [1, 8])
def test_conv_update_is_the_reference_bitwise(batch: int) -> None:
    x, w = randn(batch, CHANNELS, seed=1), randn(CHANNELS, TAPS, seed=2, scale=0.5)
    pool = randn(2 * batch + 1, CHANNELS, TAPS - 1, seed=3)
    rows = torch.arange(1, 2 * batch + 1, 2, device=CUDA)
    fresh = torch.arange(batch, device=CUDA) % 3 != 1  # some sequences start from zeros
    want_pool = pool.clone()
    want = causal_conv1d_update_ref(x, w, None, want_pool, rows, has_initial_state=fresh)
    got = causal_conv1d_update(x, w, None, pool, rows, has_initial_state=fresh)
    assert torch.equal(got, want) and torch.equal(pool, want_pool)


def test_gated_norm_and_gates_match_references() -> None:
    o, z, w = randn(4, HV, DV, seed=4, scale=2.0), randn(4, HV, DV, seed=5), randn(DV, seed=6, scale=0.3)
    got, want = gated_rms_norm(o, z, w, 1e-6), gated_rms_norm_ref(o, z, w, 1e-6)
    assert ((got.float() - want.float()).abs() <= torch.finfo(BF16).eps * want.float().abs() + 1e-30).all()
    proj = randn(4, 2 * HV, seed=7, scale=6.0)
    a, b = proj[:, :HV], proj[:, HV:]
    A_log, dt_bias = randn(HV, seed=8, dtype=torch.float32), randn(HV, seed=9)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    ref = gdn_gates_ref(a, b, A_log, dt_bias)
    assert ((g - ref.g).abs() <= 4 * torch.finfo(torch.float32).eps * ref.g.abs() + 1e-30).all()
    assert ((beta.float() - ref.beta.float()).abs() <= torch.finfo(BF16).eps * ref.beta.float().abs()).all()


def test_pieces_replay_from_a_cuda_graph() -> None:
    x, w = randn(1, CHANNELS, seed=10), randn(CHANNELS, TAPS, seed=11, scale=0.5)
    pool, rows = randn(2, CHANNELS, TAPS - 1, seed=12), torch.tensor([1], device=CUDA)
    o, z, nw = randn(1, HV, DV, seed=13), randn(1, HV, DV, seed=14), randn(DV, seed=15)
    a, b = randn(1, HV, seed=16), randn(1, HV, seed=17)
    A_log, dt_bias = randn(HV, seed=18, dtype=torch.float32), randn(HV, seed=19)

    def step() -> tuple[torch.Tensor, ...]:
        return (causal_conv1d_update(x, w, None, pool, rows), gated_rms_norm(o, z, nw, 1e-6),
                *gdn_gates(a, b, A_log, dt_bias))

    start = pool.clone()
    eager = step()
    after_eager = pool.clone()
    pool.copy_(start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    pool.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(pool, after_eager)
    for got, want in zip(captured, eager):
        assert torch.equal(got, want)
