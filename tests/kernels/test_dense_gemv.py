"""The skinny dense GEMM (`kernels/dense_gemv.py`): the Triton kernel under the
interpreter against `F.linear` (odd shapes, with and without split-K), its batch
invariance (bitwise), and the `--dense-kernel` dispatch."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from tolerances import rounding_atol, sum_atol

from edgemoe.kernels.dense_gemv import (
    dense_gemv,
    dense_gemv_ref,
    make_dense_linear,
    resolve_dense_kernel,
)

# tests/kernels/conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable. Not
# `from conftest import INTERPRET`: which conftest that finds depends on the collection order.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None

needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

N, K = 40, 300  # neither a multiple of BLOCK_N = 16 nor of BLOCK_K = 64: masks are exercised


def tiles(split: bool):
    from edgemoe.kernels.triton_ops.dense_gemv import GemvTiles

    # min_programs 1: one K range; 64 over 3 column tiles: K split into 5 ranges of 64.
    return GemvTiles(block_m=16, block_n=16, block_k=64, num_warps=4, num_stages=1,
                     min_programs=64 if split else 1, max_split=8)


def inputs(m: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=g).to(dtype), torch.randn(N, K, generator=g).to(dtype)


@needs_triton
def test_split_depends_on_the_weight_only() -> None:
    from edgemoe.kernels.triton_ops.dense_gemv import split_k

    assert split_k(N, K, tiles(False)) == (1, 320)
    split, per = split_k(N, K, tiles(True))
    assert split == 5 and per == 64 and (split - 1) * per < K <= split * per


@needs_triton
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("m", [1, 5, 19])  # 19: two token blocks
def test_fp32_matches_linear(split: bool, m: int) -> None:
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x, w = inputs(m, torch.float32, seed=m)
    got = dense_gemv_triton(x, w, tiles(split))
    want = F.linear(x, w)
    # Each is a K-term fp32 dot in some order (split-K is one more order): both within
    # γ_K of the exact sum, scaled per element by sum |x_k w_k|.
    magnitude = x.abs() @ w.abs().T
    assert got.dtype == torch.float32 and got.shape == (m, N)
    assert ((got - want).abs() <= sum_atol(torch.float32, K, 1.0) * magnitude).all()


@needs_triton
@pytest.mark.parametrize("split", [False, True])
def test_bf16_matches_linear(split: bool) -> None:
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x, w = inputs(3, torch.bfloat16, seed=7)
    got = dense_gemv_triton(x, w, tiles(split))
    want = F.linear(x, w)
    magnitude = (x.float().abs() @ w.float().abs().T)
    # fp32 sums in two orders (γ_K each), then one bf16 rounding each of the result.
    bound = sum_atol(torch.float32, K, 1.0) * magnitude + rounding_atol(torch.bfloat16, 1, 1.0) * magnitude
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want.float()).abs() <= bound).all()


@needs_triton
@pytest.mark.parametrize("split", [False, True])
def test_batch_invariant_bitwise(split: bool) -> None:
    # A row's output must not depend on M or on the other rows: row i of an M = 7 call,
    # of an M = 19 call (two token blocks, other rows different) and the M = 1 call on
    # that row alone are bitwise equal.
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x7, w = inputs(7, torch.float32, seed=11)
    x19 = torch.randn(19, K, generator=torch.Generator().manual_seed(12))
    x19[[2, 17]] = x7[[2, 5]]
    t = tiles(split)
    y7, y19 = dense_gemv_triton(x7, w, t), dense_gemv_triton(x19, w, t)
    for i in range(7):
        assert torch.equal(y7[i], dense_gemv_triton(x7[i : i + 1], w, t)[0]), i
    assert torch.equal(y19[2], y7[2]) and torch.equal(y19[17], y7[5])


def test_dispatch() -> None:
    cpu = torch.device("cpu")
    assert resolve_dense_kernel("auto", cpu) == "torch"
    assert resolve_dense_kernel("triton", cpu) == "triton"
    assert make_dense_linear("torch", cpu) is dense_gemv_ref
    assert make_dense_linear("triton", cpu) is dense_gemv
    with pytest.raises(ValueError, match="dense-kernel"):
        resolve_dense_kernel("cublas", cpu)
    # CPU tensors (and prefill-sized M anywhere) take the reference: the same result, bitwise.
    x, w = inputs(40, torch.float32, seed=3)
    assert torch.equal(dense_gemv(x, w), F.linear(x, w))
    assert torch.equal(dense_gemv(x[:2], w), F.linear(x[:2], w))
