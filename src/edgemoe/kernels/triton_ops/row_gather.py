"""out[i] = table[ids[i]], and out[dst[i]] = table[ids[i]] for ids[i] >= 0, with 64-bit
offsets (see `kernels/row_gather.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.row_gather import BLOCK_INTO
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


CHUNK_INTO = 128  # list entries a program scans at once (registers stay bounded for any N)
PROGRAMS_PER_SM = 4  # the scatter form's persistent grid


@triton.jit
def _gather_rows_into(table_ptr, ids_ptr, dst_ptr, out_ptr, N, D, stride_t, stride_o, BLOCK_D: tl.constexpr,
                      CHUNK: tl.constexpr, USE_PDL: tl.constexpr):
    # NOTE (why a persistent grid): the list is fixed-size and mostly -1 (a decode step's
    # misses are few), and a row is a whole expert part (millions of elements). A program
    # per (column block, entry) launched ~12K programs a layer at batch 1 to copy nothing
    # (8 µs a launch on an H200, 16 µs a layer for two parts). Here P programs scan the
    # list a chunk at a time and share its valid entries' column blocks round-robin: an
    # empty list costs one vector load and a cumsum a chunk.
    pid, P = tl.program_id(0), tl.num_programs(0)
    blocks = tl.cdiv(D, BLOCK_D)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    pdl_start(USE_PDL)
    done = tl.zeros([], tl.int64)  # work items (valid entry x column block) of earlier chunks
    for n0 in range(0, N, CHUNK):
        n = n0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + n, mask=n < N, other=-1)
        valid = ids >= 0  # -1: padding of a fixed-size list, nothing read or written
        dsts = tl.load(dst_ptr + n, mask=valid, other=0)
        rank = tl.cumsum(valid.to(tl.int32), axis=0) - 1  # each valid entry's index among them
        items = tl.sum(valid.to(tl.int32), axis=0).to(tl.int64) * blocks
        first = (pid - done % P + P) % P  # this program's first item of the chunk (global round-robin)
        for w in range(first, items, P):
            k = (w // blocks).to(tl.int32)
            pick = valid & (rank == k)
            row = tl.sum(tl.where(pick, ids, 0), axis=0).to(tl.int64)  # NOTE: 64-bit: row · stride may pass 2^31
            dst = tl.sum(tl.where(pick, dsts, 0), axis=0).to(tl.int64)
            c = (w % blocks) * BLOCK_D + cols
            x = tl.load(table_ptr + row * stride_t + c, mask=c < D)
            tl.store(out_ptr + dst * stride_o + c, x, mask=c < D)
        done += items


def _persistent_programs(device: torch.device) -> int:
    """The scatter form's grid: PROGRAMS_PER_SM a multiprocessor (3 under the interpreter:
    an uneven share of items, and fast)."""
    if device.type != "cuda":
        return 3
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def gather_rows_into_triton(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, dst: torch.Tensor,
                            programs: int | None = None, block: int = BLOCK_INTO, num_warps: int = 4) -> None:
    """`programs`, `block`, `num_warps`: the grid and tiles (defaults: the persistent grid,
    BLOCK_INTO; `scripts/gpu_gather_sweep.py` sweeps them)."""
    N, D = ids.numel(), table.shape[1]
    if N == 0:
        return
    assert table.stride(1) == 1 and out.stride(1) == 1 and out.shape[1] == D, "rows must be contiguous, same width"
    block_d = min(triton.next_power_of_2(D), block)
    grid = (programs or _persistent_programs(ids.device),)
    pdl = pdl_enabled(ids.device)
    _gather_rows_into[grid](table, ids, dst, out, N, D, table.stride(0), out.stride(0), BLOCK_D=block_d,
                            CHUNK=CHUNK_INTO, USE_PDL=pdl, launch_pdl=pdl, num_warps=num_warps)
