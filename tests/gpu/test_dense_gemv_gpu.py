"""The Triton skinny GEMM (`kernels/triton_ops/dense_gemv.py`) compiled, bf16, at
Qwen3-30B-A3B's decode shapes: against the exact (fp64) product, bitwise batch
invariance of the compiled tl.dot, and CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch
from tolerances import rounding_atol, sum_atol

from edgemoe.kernels.dense_gemv import dense_gemv
from edgemoe.kernels.triton_ops.dense_gemv import (
    DEFAULT_TILES,
    dense_gemv_triton,
    split_k,
)

# (N, K): fused qkv, o_proj, the router (split-K), the LM head
SHAPES = [(5120, 2048), (2048, 4096), (128, 2048), (151936, 2048)]


def operands(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(n + k + m)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 7, 32])
def test_matches_exact_product(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    x, w = operands(m, n, k, dtype)
    got = dense_gemv(x, w)
    exact = x.double() @ w.double().T
    magnitude = x.double().abs() @ w.double().abs().T
    # An fp32 sum of K products (any order, split-K included): γ_K·Σ|x w|; then one
    # rounding to the output dtype of a value within that of the exact one.
    fp32 = sum_atol(torch.float32, k, 1.0) * magnitude
    bound = fp32 + rounding_atol(dtype, 1, 1.0) * (exact.abs() + fp32)
    assert got.dtype == dtype and got.shape == (m, n)
    assert ((got.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_batch_invariant_bitwise(n: int, k: int) -> None:
    # A row's output is the same bits at M = 1, 7 and 32, whatever the other rows are.
    x, w = operands(32, n, k)
    y32 = dense_gemv_triton(x, w)
    y7 = dense_gemv_triton(x[[3, 0, 31, 9, 12, 30, 1]], w)
    assert torch.equal(y7, y32[[3, 0, 31, 9, 12, 30, 1]])
    for i in (0, 5, 16, 31):
        assert torch.equal(dense_gemv_triton(x[i : i + 1], w)[0], y32[i]), i


def test_router_shape_splits_k() -> None:
    assert split_k(128, 2048, DEFAULT_TILES)[0] > 1  # the split-K path is what the router runs
    assert split_k(5120, 2048, DEFAULT_TILES)[0] == 1


@pytest.mark.parametrize(("n", "k"), [(5120, 2048), (128, 2048)])
def test_cuda_graph_replay_equals_eager(n: int, k: int) -> None:
    x, w = operands(4, n, k)
    static = x.clone()
    dense_gemv(static, w)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dense_gemv(static, w)
    fresh = torch.randn_like(static)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, dense_gemv(fresh, w))
