"""The dense decode GEMV (`kernels/dense_gemv.py`): the Triton kernel under the
interpreter against `F.linear` (ragged N and K, M = 1..TOKENS + 1, token blocks of 2, 4
and 8), its batch invariance (bitwise), its tiles' override, and the `--dense-kernel`
dispatch."""

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
from edgemoe.kernels.dense_gemv_tiles import ENV, DenseGemvTiles, rows_for, tiles

# tests/kernels/conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable. Not
# `from conftest import INTERPRET`: which conftest that finds depends on the collection order.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None

needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

N, K = 37, 300  # a multiple of neither the row tiles (8, 4) nor COLS (64, 128): every mask is exercised
# (rows, cols, warps, tokens, min_row_tiles, stages): 2-token blocks; 4-token blocks whose 16 rows
# halve to 4 (37 rows: 3 tiles of 16, 5 of 8, then 10 of 4 >= 8); 8-token blocks, 128 columns
# (300 = 2 x 128 + 44), 2 stages.
TILES = [DenseGemvTiles(8, 64, 4, 2, 1, 1), DenseGemvTiles(16, 64, 4, 4, 8, 1), DenseGemvTiles(8, 128, 2, 8, 1, 2)]
IDS = ["tok2", "tok4-halved", "tok8"]


def inputs(m: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=g).to(dtype), torch.randn(N, K, generator=g).to(dtype)


def test_rows_depend_on_the_weight_only() -> None:
    assert rows_for(N, TILES[0]) == 8 and rows_for(N, TILES[1]) == 4
    assert rows_for(5120, DenseGemvTiles(16, 256, 4, 2, 256)) == 16  # qkv: 320 tiles of 16
    assert rows_for(2048, DenseGemvTiles(16, 256, 4, 2, 256)) == 8  # o_proj: 256 tiles of 8
    assert rows_for(3, DenseGemvTiles(16, 256, 4, 2, 256)) == 1  # never below one row


def test_tiles_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "8,512,8,4")
    assert tiles() == DenseGemvTiles(8, 512, 8, 4)  # min_row_tiles and stages keep the defaults
    chosen = DenseGemvTiles(8, 512, 8, 4, 64, 2)
    monkeypatch.setenv(ENV, chosen.label())  # the string the sweep prints selects its tiles
    assert tiles() == chosen
    monkeypatch.setenv(ENV, "8,512,8,16")
    with pytest.raises(ValueError, match="at most 8 tokens"):
        tiles()
    monkeypatch.setenv(ENV, "8,500,8,4")
    with pytest.raises(ValueError, match="powers of two"):
        tiles()


@needs_triton
@pytest.mark.parametrize("t", TILES, ids=IDS)
def test_fp32_matches_linear(t: DenseGemvTiles) -> None:
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    for m in range(1, t.tokens + 2):  # one partial block .. one full block and one token more
        x, w = inputs(m, torch.float32, seed=m)
        got = dense_gemv_triton(x, w, t)
        want = F.linear(x, w)
        # Each is a K-term fp32 dot in some order: both within γ_K of the exact sum,
        # scaled per element by sum |x_k w_k|.
        magnitude = x.abs() @ w.abs().T
        assert got.dtype == torch.float32 and got.shape == (m, N)
        assert ((got - want).abs() <= sum_atol(torch.float32, K, 1.0) * magnitude).all(), m


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_matches_linear(dtype: torch.dtype) -> None:
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x, w = inputs(3, dtype, seed=7)
    got = dense_gemv_triton(x, w, TILES[0])
    want = F.linear(x, w)
    magnitude = x.float().abs() @ w.float().abs().T
    # fp32 sums in two orders (γ_K each), then one rounding each to the output dtype.
    bound = sum_atol(torch.float32, K, 1.0) * magnitude + rounding_atol(dtype, 1, 1.0) * magnitude
    assert got.dtype == dtype
    assert ((got.float() - want.float()).abs() <= bound).all()


@needs_triton
def test_fp32_router_weight_over_bf16_activations() -> None:
    """A sigmoid router's logits (`router_sigmoid.router_logits` on a GPU): bf16 x, fp32
    weight, fp32 out, never rounded: F.linear(x.float(), w)'s terms within γ_K of each
    other's order, and each row's the same whatever the batch (the route must not depend
    on it)."""
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x, _ = inputs(5, torch.bfloat16, seed=13)
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(14)) * 0.05
    got = dense_gemv_triton(x, w, TILES[0], out_dtype=torch.float32)
    want = F.linear(x.float(), w)
    magnitude = x.float().abs() @ w.abs().T
    assert got.dtype == torch.float32
    assert ((got - want).abs() <= sum_atol(torch.float32, K, 1.0) * magnitude).all()
    rounded = dense_gemv_triton(x, w.to(torch.bfloat16), TILES[0]).float()
    assert ((rounded - want).abs() > sum_atol(torch.float32, K, 1.0) * magnitude).any()  # fp32 kept, not bf16
    for i in (0, 4):
        assert torch.equal(got[i], dense_gemv_triton(x[i : i + 1], w, TILES[0], out_dtype=torch.float32)[0]), i


@needs_triton
def test_bias_enters_before_the_rounding() -> None:
    """A projection's bias (GLM's q/k/v, gpt-oss's o_proj) added to the fp32 sum before the
    one rounding, as F.linear adds it: within the same bound as without, of |x·w| + |b|."""
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x, w = inputs(3, torch.bfloat16, seed=8)
    b = (torch.randn(N, generator=torch.Generator().manual_seed(9)) * 4).to(torch.bfloat16)
    got = dense_gemv_triton(x, w, TILES[0], bias=b)
    want = F.linear(x.float(), w.float(), b.float())
    magnitude = x.float().abs() @ w.float().abs().T + b.float().abs()
    bound = sum_atol(torch.float32, K + 1, 1.0) * magnitude + rounding_atol(torch.bfloat16, 1, 1.0) * want.abs()
    assert ((got.float() - want).abs() <= bound).all()
    no_bias = dense_gemv_triton(x, w, TILES[0]).float()
    assert ((no_bias - want).abs() > bound).any()  # the bias is there (not vacuous)
    assert torch.equal(dense_gemv_ref(x, w, b), F.linear(x, w, b))


@needs_triton
@pytest.mark.parametrize("t", TILES[:2], ids=IDS[:2])
def test_batch_invariant_bitwise(t: DenseGemvTiles) -> None:
    # A row's output must not depend on M, on its slot in a token block or on the other
    # rows: rows 0, 3, 4 of an M = 5 call (first, last and first slot of a block at 2 and 4
    # tokens a block) equal the M = 1 call on that row alone, and rows
    # copied into other positions of an M = 7 call with different neighbours are equal too.
    from edgemoe.kernels.triton_ops.dense_gemv import dense_gemv_triton

    x5, w = inputs(5, torch.bfloat16, seed=11)
    x7 = torch.randn(7, K, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    x7[[1, 6]] = x5[[4, 0]]
    y5, y7 = dense_gemv_triton(x5, w, t), dense_gemv_triton(x7, w, t)
    for i in (0, 3, 4):
        assert torch.equal(y5[i], dense_gemv_triton(x5[i : i + 1], w, t)[0]), i
    assert torch.equal(y7[1], y5[4]) and torch.equal(y7[6], y5[0])


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


def test_auto_takes_the_gemv_for_one_token_only(monkeypatch) -> None:  # noqa: ANN001
    """auto on a GPU: one token goes to the Triton GEMV, two and more to cuBLAS."""
    from edgemoe.kernels import dense_gemv as dense

    gpu = torch.device("cuda")
    monkeypatch.setattr(dense, "triton_importable", lambda: True)
    assert dense.resolve_dense_kernel("auto", gpu) == "auto"
    assert dense.make_dense_linear("auto", gpu) is dense.dense_gemv_single
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(dense, "dense_gemv", lambda x, w, b=None: calls.append(("gemv", x.shape[0])) or F.linear(x, w))
    monkeypatch.setattr(dense, "dense_gemv_ref", lambda x, w, b=None: calls.append(("ref", x.shape[0])) or F.linear(x, w))
    x, w = inputs(3, torch.float32, seed=4)
    for m in (1, 2, 3):
        assert torch.equal(dense.dense_gemv_single(x[:m], w), F.linear(x[:m], w))
    assert calls == [("gemv", 1), ("ref", 2), ("ref", 3)]
