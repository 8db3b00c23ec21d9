"""The bf16 decode GEMV (triton_ops/moe_gemv.py) compiled, at the Qwen3-30B-A3B expert shape
(H=2048, I=768, K=8): bitwise the kernel it was before the activations were loaded in the
weight tile's layout (its loop kept below as the oracle); software-pipelined at the default
tiles bitwise the unpipelined kernel; the other tile families of the sweep
(scripts/gpu_kernel_bench.py --only moe_sweep) within the reference's rounding bound and
batch-invariant."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgemoe.kernels.moe_fused import moe_slots_ref
from edgemoe.kernels.moe_gemv_tiles import DEFAULT, ENV
from edgemoe.testing.kernel_inputs import MoEBatch, moe_batch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
H, I, S, K = 2048, 768, 16, 8

if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl

    from edgemoe.kernels.triton_ops.moe_common import (
        store_cell_rows,
        store_gated_rows,
        tile_range,
    )

    @triton.jit
    def _prev_chunk(ptr, row, stride, c0, n, row_ok, COLS: tl.constexpr):
        cols = c0 + tl.arange(0, COLS)
        col_ok = cols < n
        v = tl.load(ptr + row.to(tl.int64) * stride + cols, mask=col_ok, other=0.0).to(tl.float32)
        return cols, v, row_ok[:, None] & col_ok[None, :]

    @triton.jit
    def _prev_gate_up(x_ptr, slot_ptr, gu_ptr, inter_ptr, H, I, K, stride_xt, stride_gs, stride_gr, stride_it,
                      ACT: tl.constexpr, DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                      INTERP: tl.constexpr):
        # The gate/up kernel before this change (S = 1): the activations as a [COLS] vector.
        pair = tl.program_id(0)
        slot = tl.load(slot_ptr + pair)
        if slot < 0:
            return
        rows, row_ok = tile_range(1, ROWS, I)
        bank = gu_ptr + slot.to(tl.int64) * stride_gs
        acc_g = tl.zeros([ROWS, COLS], dtype=tl.float32)
        acc_u = tl.zeros([ROWS, COLS], dtype=tl.float32)
        for h0 in tl.range(0, H, COLS):  # `range` as the kernel had it (the same scf.for)
            cols, xv, ok = _prev_chunk(x_ptr, pair // K, stride_xt, h0, H, row_ok, COLS)
            g = tl.load(bank + rows[:, None] * stride_gr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            u = tl.load(bank + (rows + I)[:, None] * stride_gr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            acc_g += g * xv[None, :]
            acc_u += u * xv[None, :]
        store_gated_rows(inter_ptr, stride_it, pair, rows, row_ok, acc_g, acc_u, ACT, DTYPE, INTERP)

    @triton.jit
    def _prev_down(inter_ptr, slot_ptr, w_ptr, down_ptr, cells_ptr, H, I, K, stride_it, stride_ds, stride_dr,
                   stride_ct, stride_ck, DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                   INTERP: tl.constexpr):
        pair = tl.program_id(0)
        slot = tl.load(slot_ptr + pair)
        if slot < 0:
            return
        rows, row_ok = tile_range(1, ROWS, H)
        bank = down_ptr + slot.to(tl.int64) * stride_ds
        acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
        for i0 in tl.range(0, I, COLS):
            cols, a, ok = _prev_chunk(inter_ptr, pair, stride_it, i0, I, row_ok, COLS)
            d = tl.load(bank + rows[:, None] * stride_dr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            acc += d * a[None, :]
        store_cell_rows(cells_ptr, w_ptr, acc, pair, rows, row_ok, K, stride_ct, stride_ck, DTYPE, INTERP)


def previous_kernel(b: MoEBatch, cells: torch.Tensor) -> None:
    """The decode GEMV as it was, at the default tiles (silu; also runs interpreted)."""
    from edgemoe.kernels.triton_ops.common import interpreting

    interp = interpreting(b.x)
    T = b.x.shape[0]
    slots = b.slot_ids.to(torch.int32).contiguous().view(-1)
    w = b.weights.float().contiguous().view(-1)
    inter = torch.empty(T * K, I, dtype=b.x.dtype, device=b.x.device)
    t = DEFAULT
    _prev_gate_up[(T * K, triton.cdiv(I, t.gu_rows))](
        b.x, slots, b.gate_up, inter, H, I, K, b.x.stride(0), b.gate_up.stride(0), b.gate_up.stride(1),
        inter.stride(0), ACT=0, DTYPE=tl.bfloat16, ROWS=t.gu_rows, COLS=t.gu_cols, INTERP=interp, num_warps=t.gu_warps)
    _prev_down[(T * K, triton.cdiv(H, t.down_rows))](
        inter, slots, w, b.down, cells, H, I, K, inter.stride(0), b.down.stride(0), b.down.stride(1),
        cells.stride(0), cells.stride(1), DTYPE=tl.bfloat16, ROWS=t.down_rows, COLS=t.down_cols, INTERP=interp,
        num_warps=t.down_warps)


def decode(b: MoEBatch, tokens: slice | None = None) -> torch.Tensor:
    from edgemoe.kernels.triton_ops.moe_gemv import moe_decode_triton

    sl = tokens or slice(None)
    x, ids, w = b.x[sl], b.slot_ids[sl], b.weights[sl]
    cells = torch.full((x.shape[0], K, H), float("nan"), device=x.device)
    moe_decode_triton(x, ids, w, b.gate_up, b.down, cells, "silu")
    return cells


@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_decode_is_the_previous_kernel_bitwise(tokens: int) -> None:
    # The activations' layout is the only change: every product and every fp32 sum is the
    # previous kernel's, so the cells must be too, bit for bit (padding pairs left NaN).
    assert DEFAULT.gu_stages == DEFAULT.down_stages == 1
    b = moe_batch(tokens, K, H, I, S, torch.bfloat16, device="cuda", seed=20 + tokens, unrouted=0.1)
    want = torch.full((tokens, K, H), float("nan"), device="cuda")
    previous_kernel(b, want)
    assert torch.equal(decode(b).nan_to_num(), want.nan_to_num())


# Software pipelining at the default tiles: only when loads are issued moves.
PIPELINED = [f"{','.join(str(v) for v in DEFAULT[:7])},{s},{s}" for s in (2, 3)]
# Other tile families of the sweep (rows, cols, warps of each launch; no split; stages).
FAMILIES = ["16,256,4,16,256,4,1,2,2", "8,256,4,8,256,4,1,3,3", "32,128,8,32,128,8,1,1,1", "16,128,8,16,128,8,1,2,2"]


@pytest.mark.parametrize("tokens", [1, 8])
@pytest.mark.parametrize("tiles", PIPELINED)
def test_pipelined_decode_bitwise(tiles: str, tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    b = moe_batch(tokens, K, H, I, S, torch.bfloat16, device="cuda", seed=30 + tokens, unrouted=0.1)
    plain = decode(b)
    monkeypatch.setenv(ENV, tiles)
    assert torch.equal(decode(b).nan_to_num(), plain.nan_to_num())


@pytest.mark.parametrize("tokens", [1, 8])
@pytest.mark.parametrize("tiles", FAMILIES)
def test_sweep_tiles_match_reference(tiles: str, tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, tiles)
    b = moe_batch(tokens, K, H, I, S, torch.bfloat16, device="cuda", seed=40 + tokens, unrouted=0.1)
    want = torch.full((tokens, K, H), float("nan"), device="cuda")
    moe_slots_ref(b.x, b.slot_ids, b.weights, b.gate_up, b.down, want, "silu")
    got = decode(b)
    skipped = (b.slot_ids < 0)[..., None].expand_as(got)
    assert got[skipped].isnan().all() and not got[~skipped].isnan().any()
    # Another tile sums each row's fp32 products in another order: each of the chain's 4
    # bf16 roundings (projection, act, product, down) may land one ulp (2^-7) apart.
    scale = want.nan_to_num().abs().amax(dim=-1, keepdim=True)
    assert ((got - want).nan_to_num().abs() <= 4 * 2**-7 * scale).all()
    alone = decode(b, slice(tokens - 1, tokens))  # the last token by itself: the same bits
    assert torch.equal(alone[0].nan_to_num(), got[-1].nan_to_num())
