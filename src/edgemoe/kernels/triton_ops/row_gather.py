"""out[i] = table[ids[i]], and out[dst[i]] = table[ids[i]] for ids[i] >= 0, with 64-bit
offsets (see `kernels/row_gather.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import pdl_start

ROWS = 8  # rows per program


@triton.jit
def _gather_rows(table_ptr, ids_ptr, out_ptr, N, D, stride_t, stride_o, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
                 USE_PDL: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    c = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)
    ok_r = r < N
    pdl_start(USE_PDL)
    row = tl.load(ids_ptr + r, mask=ok_r, other=0).to(tl.int64)  # NOTE: 64-bit: row · stride may pass 2^31
    mask = ok_r[:, None] & (c < D)[None, :]
    x = tl.load(table_ptr + row[:, None] * stride_t + c[None, :], mask=mask)
    tl.store(out_ptr + r[:, None] * stride_o + c[None, :], x, mask=mask)


def gather_rows_triton(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    N, D = ids.numel(), table.shape[1]
    out = torch.empty((N, D), dtype=table.dtype, device=ids.device)
    if N == 0:
        return out
    assert table.stride(1) == 1, "rows must be contiguous"
    block_d = min(triton.next_power_of_2(D), 256)
    grid = (triton.cdiv(N, ROWS), triton.cdiv(D, block_d))
    pdl = pdl_enabled(ids.device)
    _gather_rows[grid](table, ids, out, N, D, table.stride(0), out.stride(0), BLOCK_D=block_d, ROWS=ROWS,
                       USE_PDL=pdl, launch_pdl=pdl)
    return out


BLOCK_INTO = 1024  # columns per program of the scatter form (its rows are whole experts: wide)


@triton.jit
def _gather_rows_into(table_ptr, ids_ptr, dst_ptr, out_ptr, D, stride_t, stride_o, BLOCK_D: tl.constexpr,
                      USE_PDL: tl.constexpr):
    # Columns on axis 0 (up to 2^31 blocks): one row is a whole expert part, millions wide.
    c = tl.program_id(0).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)
    i = tl.program_id(1)
    pdl_start(USE_PDL)
    row = tl.load(ids_ptr + i).to(tl.int64)  # NOTE: 64-bit: row · stride may pass 2^31
    dst = tl.load(dst_ptr + i).to(tl.int64)
    mask = (c < D) & (row >= 0)  # -1: padding of a fixed-size list, nothing read or written
    x = tl.load(table_ptr + row * stride_t + c, mask=mask)
    tl.store(out_ptr + dst * stride_o + c, x, mask=mask)


def gather_rows_into_triton(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, dst: torch.Tensor) -> None:
    N, D = ids.numel(), table.shape[1]
    if N == 0:
        return
    assert table.stride(1) == 1 and out.stride(1) == 1 and out.shape[1] == D, "rows must be contiguous, same width"
    assert N <= 65535, "one program row per entry: at most 65,535 entries"
    block_d = min(triton.next_power_of_2(D), BLOCK_INTO)
    grid = (triton.cdiv(D, block_d), N)
    pdl = pdl_enabled(ids.device)
    _gather_rows_into[grid](table, ids, dst, out, D, table.stride(0), out.stride(0), BLOCK_D=block_d, USE_PDL=pdl,
                            launch_pdl=pdl)
