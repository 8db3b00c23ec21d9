"""The dense decode GEMV (`kernels/triton_ops/dense_gemv.py`) compiled, bf16/fp16, at
Qwen3-30B-A3B's decode shapes: against the exact (fp64) product, bitwise batch
invariance of the compiled kernel (at the default tiles and at every token block size),
and CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch
from tolerances import rounding_atol, sum_atol

from edgemoe.kernels.dense_gemv import dense_gemv
from edgemoe.kernels.dense_gemv_tiles import DenseGemvTiles
from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

pytestmark = pytest.mark.gpu

# (N, K): fused qkv, o_proj (its rows halved to 8: 256 row tiles), the router, the LM head
SHAPES = [(5120, 2048), (2048, 4096), (128, 2048), (151936, 2048)]
# the default tiles, then 1, 4 and 8 tokens a block (each compiles its own accumulators)
TILES = [None, DenseGemvTiles(16, 256, 4, 1), DenseGemvTiles(8, 256, 4, 4), DenseGemvTiles(4, 256, 4, 8)]


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
    # An fp32 sum of K products (any order): γ_K·Σ|x w|; then one rounding to the output
    # dtype of a value within that of the exact one.
    fp32 = sum_atol(torch.float32, k, 1.0) * magnitude
    bound = fp32 + rounding_atol(dtype, 1, 1.0) * (exact.abs() + fp32)
    assert got.dtype == dtype and got.shape == (m, n)
    assert ((got.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("tiles", TILES, ids=["default", "tok1", "tok4", "tok8"])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_batch_invariant_bitwise(n: int, k: int, tiles: DenseGemvTiles | None) -> None:
    # A row's output is the same bits at M = 1, 7 and 32, whatever the other rows are and
    # whichever slot of a token block it lands in.
    x, w = operands(32, n, k)
    y32 = dense_gemv_triton(x, w, tiles)
    pick = [3, 0, 31, 9, 12, 30, 1]
    assert torch.equal(dense_gemv_triton(x[pick], w, tiles), y32[pick])
    for i in (0, 5, 16, 31):
        assert torch.equal(dense_gemv_triton(x[i : i + 1], w, tiles)[0], y32[i]), i


@pytest.mark.parametrize(("n", "k"), [(5120, 2048), (2048, 4096)])
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
