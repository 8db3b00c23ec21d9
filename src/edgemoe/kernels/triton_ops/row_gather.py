"""out[i] = table[ids[i]], and out[dst[i]] = table[ids[i]] for ids[i] >= 0, with 64-bit
offsets, for one table or for up to MAX_PARTS tables that share the list (see
`kernels/row_gather.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.gather_grid import BLOCK_INTO
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
MAX_PARTS = 8  # tables one launch of the parts form gathers (an expert's parts: 2 in bf16, 6 in int4)


@triton.jit
def _gather_part(table_ptr, out_ptr, D, stride_t, stride_o, ids, dsts, valid, rank, count, pid, P, done,
                 BLOCK_D: tl.constexpr):
    """One table's share of a chunk: its (valid entry x column block) items, numbered on
    from `done` so the round-robin runs on across tables; returns the items numbered."""
    blocks = tl.cdiv(D, BLOCK_D)
    items = count * blocks
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    first = (pid - done % P + P) % P  # this program's first item here (a global round-robin)
    for w in range(first, items, P):
        k = (w // blocks).to(tl.int32)
        pick = valid & (rank == k)
        row = tl.sum(tl.where(pick, ids, 0), axis=0).to(tl.int64)  # NOTE: 64-bit: row · stride may pass 2^31
        dst = tl.sum(tl.where(pick, dsts, 0), axis=0).to(tl.int64)
        c = (w % blocks) * BLOCK_D + cols
        x = tl.load(table_ptr + row * stride_t + c, mask=c < D)
        tl.store(out_ptr + dst * stride_o + c, x, mask=c < D)
    return done + items


@triton.jit
def _gather_parts_into(ids_ptr, dst_ptr, N,  # then each part's table, out, width and row strides
                       t0_ptr, o0_ptr, d0, st0, so0, t1_ptr, o1_ptr, d1, st1, so1,
                       t2_ptr, o2_ptr, d2, st2, so2, t3_ptr, o3_ptr, d3, st3, so3,
                       t4_ptr, o4_ptr, d4, st4, so4, t5_ptr, o5_ptr, d5, st5, so5,
                       t6_ptr, o6_ptr, d6, st6, so6, t7_ptr, o7_ptr, d7, st7, so7,
                       PARTS: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, USE_PDL: tl.constexpr):
    # NOTE (why a persistent grid): the list is fixed-size and mostly -1 (a decode step's
    # misses are few), and a row is a whole expert part (millions of elements). A program
    # per (column block, entry) launched ~12K programs a layer at batch 1 to copy nothing
    # (8 µs a launch on an H200, 16 µs a layer for two parts). Here P programs scan the
    # list a chunk at a time and share its valid entries' column blocks round-robin: an
    # empty list costs one vector load and a cumsum a chunk.
    # NOTE (why every part in one launch): even so a launch that copies nothing cost ~6 µs
    # in a graph (the 2026-12-05 profile), and an int4 expert is six tables (two weights,
    # their scales and zero points): six launches a layer. Parts past PARTS are never read
    # (their arguments repeat part 0's). Triton has no arrays of pointers: each part is
    # its own arguments and its own line below.
    pid, P = tl.program_id(0), tl.num_programs(0)
    pdl_start(USE_PDL)
    done = tl.zeros([], tl.int64)  # work items (valid entry x column block) of earlier chunks and parts
    for n0 in range(0, N, CHUNK):
        n = n0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + n, mask=n < N, other=-1)
        valid = ids >= 0  # -1: padding of a fixed-size list, nothing read or written
        dsts = tl.load(dst_ptr + n, mask=valid, other=0)
        rank = tl.cumsum(valid.to(tl.int32), axis=0) - 1  # each valid entry's index among them
        count = tl.sum(valid.to(tl.int32), axis=0).to(tl.int64)
        done = _gather_part(t0_ptr, o0_ptr, d0, st0, so0, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 1:
            done = _gather_part(t1_ptr, o1_ptr, d1, st1, so1, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 2:
            done = _gather_part(t2_ptr, o2_ptr, d2, st2, so2, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 3:
            done = _gather_part(t3_ptr, o3_ptr, d3, st3, so3, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 4:
            done = _gather_part(t4_ptr, o4_ptr, d4, st4, so4, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 5:
            done = _gather_part(t5_ptr, o5_ptr, d5, st5, so5, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 6:
            done = _gather_part(t6_ptr, o6_ptr, d6, st6, so6, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)
        if PARTS > 7:
            done = _gather_part(t7_ptr, o7_ptr, d7, st7, so7, ids, dsts, valid, rank, count, pid, P, done, BLOCK_D)


def _persistent_programs(device: torch.device) -> int:
    """The scatter form's grid: PROGRAMS_PER_SM a multiprocessor (3 under the interpreter:
    an uneven share of items, and fast)."""
    if device.type != "cuda":
        return 3
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def gather_rows_into_triton(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, dst: torch.Tensor,
                            programs: int | None = None, block: int = BLOCK_INTO, num_warps: int = 4) -> None:
    """`programs`, `block`, `num_warps`: the grid and tiles (defaults: the persistent grid,
    BLOCK_INTO; `scripts/gpu_gather_sweep.py` sweeps them). The parts form with one part."""
    gather_parts_into_triton([table], ids, [out], dst, programs, block, num_warps)


def gather_parts_into_triton(tables: list[torch.Tensor], ids: torch.Tensor, outs: list[torch.Tensor],
                             dst: torch.Tensor, programs: int | None = None, block: int = BLOCK_INTO,
                             num_warps: int = 4) -> None:
    """`gather_rows_into_triton` for every (table, out) pair at once: one launch, the
    list read once a chunk, the work items of all parts shared round-robin."""
    if not 0 < len(tables) == len(outs) <= MAX_PARTS:
        raise ValueError(f"{len(tables)} tables and {len(outs)} outs: the parts form takes 1..{MAX_PARTS} pairs")
    N = ids.numel()
    if N == 0:
        return
    args: list = []
    for table, out in zip(tables, outs, strict=True):
        D = table.shape[1]
        assert table.stride(1) == 1 and out.stride(1) == 1 and out.shape[1] == D, "rows must be contiguous, same width"
        args += [table, out, D, table.stride(0), out.stride(0)]
    args += args[:5] * (MAX_PARTS - len(tables))  # never read: PARTS stops the kernel before them
    block_d = min(triton.next_power_of_2(max(t.shape[1] for t in tables)), block)
    grid = (programs or _persistent_programs(ids.device),)
    pdl = pdl_enabled(ids.device)
    _gather_parts_into[grid](ids, dst, N, *args, PARTS=len(tables), BLOCK_D=block_d, CHUNK=CHUNK_INTO,
                             USE_PDL=pdl, launch_pdl=pdl, num_warps=num_warps)
