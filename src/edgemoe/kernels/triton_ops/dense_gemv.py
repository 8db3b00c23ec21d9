"""Skinny GEMM for decode-sized batches: y = x @ W.T, W [N, K] (nn.Linear layout).

At M <= 32 tokens a dense projection is pure weight bandwidth (Qwen3-30B-A3B's fused
qkv is 2048 x 5120 bf16 = 21 MB, read once per step), so the grid spreads W over many
programs: each owns BLOCK_N output columns of a BLOCK_M block of tokens and streams its
W rows along K with wide loads; a weight with few column tiles (a router: N = 128) is
also split along K into SPLIT contiguous ranges whose fp32 partials a second launch sums
in the fixed order s = 0..SPLIT-1 (deterministic, no atomics).

NOTE (batch invariance): every tile constant (BLOCK_M/N/K, warps, stages) and SPLIT is
chosen from (N, K) and the config only, never from M. A token's row is always computed
by the same tl.dot shape and K order, whatever the other rows are, so its output is
bitwise the same at any M (BLOCK_M is the tile height even when M = 1: the padded rows
are masked loads, which cost no bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import (
    interpreting,
    mma,
    pdl_start,
    round_to,
    tl_dtype,
)


@dataclass(frozen=True)
class GemvTiles:
    """One tile configuration (swept by scripts/gpu_dense_gemv_sweep.py).

    `min_programs`: split K until the grid has at least this many programs per token
    block (a constant, not the device's SM count, so results do not depend on the GPU's
    size either); `max_split` caps the split (each split adds an fp32 partial row)."""

    block_m: int = 16
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    min_programs: int = 128
    max_split: int = 16

    def label(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}"
                f"p{self.min_programs}x{self.max_split}")


# NOTE: a placeholder until the sweep has run on an H200 (the lead measures it): 16
# columns x 256 of K bf16 = 8 KiB of W per step, 320 programs for qkv 2048 -> 5120.
DEFAULT_TILES = GemvTiles()


def split_k(n: int, k: int, tiles: GemvTiles) -> tuple[int, int]:
    """(SPLIT, K range per split, a multiple of BLOCK_K) for a weight [n, k]: a function of
    the weight's shape and the tiles only (batch invariance)."""
    n_tiles = triton.cdiv(n, tiles.block_n)
    k_blocks = triton.cdiv(k, tiles.block_k)
    want = min(triton.cdiv(tiles.min_programs, n_tiles), tiles.max_split, k_blocks)
    per = triton.cdiv(k_blocks, max(want, 1)) * tiles.block_k
    return triton.cdiv(k, per), per


@triton.jit
def _row_invariant_mma(a, b, acc, INTERP: tl.constexpr):
    """acc + a @ b. The interpreter's tl.dot is numpy's BLAS sgemm, whose result for a row
    depends on the row's position in the tile (edge microkernels): there, an elementwise
    product summed over K (numpy reduces each (m, n) the same way at any m). On the GPU,
    tl.dot: an MMA computes every row of its tile by the same instruction sequence."""
    if INTERP:
        acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        acc = mma(a, b, acc, INTERP)
    return acc


# NOTE: M is not specialised (Triton would compile M == 1 and M % 16 == 0 apart): one
# compiled kernel serves every batch size, so no M can pick different code for a row.
@triton.jit(do_not_specialize=["M"])
def _gemv_tile(
    x_ptr, w_ptr, out_ptr, M, N, K, K_PER, stride_xm, stride_wn, stride_os, stride_om,
    DTYPE: tl.constexpr, PARTIAL: tl.constexpr, INTERP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # NOTE: W is never written by a kernel and could stream before the wait; the loop
    # loads x and W together, so the wait comes first.
    pdl_start(USE_PDL)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    k_lo = pid_s * K_PER
    k_hi = tl.minimum(k_lo + K_PER, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        xt = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None],
                     mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]: W.T's tile
        acc = _row_invariant_mma(xt, wt, acc, INTERP)
    out = out_ptr + pid_s * stride_os + rows[:, None] * stride_om + cols[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    if PARTIAL:
        tl.store(out, acc, mask=ok)
    else:
        tl.store(out, round_to(acc, DTYPE, INTERP), mask=ok)


@triton.jit
def _sum_splits(
    part_ptr, out_ptr, total, SPLIT, stride_ps,
    DTYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    """out[i] = sum over s = 0..SPLIT-1 of part[s, i], in that order (fp32), rounded once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pdl_start(USE_PDL)
    ok = offs < total
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(part_ptr + s * stride_ps + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, round_to(acc, DTYPE, INTERP), mask=ok)


def dense_gemv_triton(x: torch.Tensor, w: torch.Tensor, tiles: GemvTiles = DEFAULT_TILES) -> torch.Tensor:
    """x [M, K] (unit stride along K), w [N, K] → [M, N] in x's dtype, fp32 accumulation.

    Capturable: no host sync; the split-K partials [SPLIT, M, N] fp32 come from torch's
    allocator (a captured graph keeps its own), sized by the (fixed) M of the call."""
    M, K = x.shape
    N = w.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if w.stride(-1) != 1:
        w = w.contiguous()
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    split, per = split_k(N, K, tiles)
    interp, dtype = interpreting(x), tl_dtype(x.dtype)
    partial = split > 1
    pdl = pdl_enabled(x.device)
    target = torch.empty(split, M, N, dtype=torch.float32, device=x.device) if partial else out
    grid = (triton.cdiv(N, tiles.block_n), split, triton.cdiv(M, tiles.block_m))
    _gemv_tile[grid](
        x, w, target, M, N, K, per, x.stride(0), w.stride(0), target.stride(0) if partial else 0, N,
        DTYPE=dtype, PARTIAL=partial, INTERP=interp,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, USE_PDL=pdl, launch_pdl=pdl,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if partial:
        block = 1024
        _sum_splits[(triton.cdiv(M * N, block),)](
            target, out, M * N, split, target.stride(0), DTYPE=dtype, INTERP=interp, BLOCK=block, USE_PDL=pdl,
            launch_pdl=pdl, num_warps=4,
        )
    return out
