"""Row gather from a table that may live in host memory: out[i] = table[ids[i]].

Used where a table is too large for the device (Qwen3.8-Flash-Next's PLE tables, a
host-resident token embedding): the table stays in pinned host RAM, mapped into the
device's address space (`ple/host_store.uva_view`), and a device kernel reads the few
rows a step needs over PCIe. Row offsets are 64-bit (a table of 2^31+ elements).

`gather_rows_ref` is the reference (index_select: on the CPU the host path itself); the
Triton kernel runs for CUDA tensors (a mapped host table is one) of any dtype: it copies
bits, one program per (row tile, column block), no host sync, capturable in a CUDA graph.

`gather_rows_into` is the same gather written into chosen rows of an existing tensor,
skipping ids of -1; `gather_parts_into` does it for several tables that share one list in
one launch: the device expert cache's mover (`moe/movers.py`) copies missed experts (one
row per expert and part) from the mapped host store into their slots with it.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.backend import triton_importable
from edgemoe.kernels.gather_grid import GatherGrid

def gather_rows_ref(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """table [R, D], ids [N] int64 (any shape: flattened) → [N, D] on ids' device."""
    return table.index_select(0, ids.reshape(-1).to(table.device)).to(ids.device)


def gather_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Same contract as `gather_rows_ref`; the Triton kernel for CUDA tensors."""
    if not (ids.is_cuda and table.is_cuda and triton_importable()):
        return gather_rows_ref(table, ids)
    from edgemoe.kernels.triton_ops.row_gather import gather_rows_triton

    return gather_rows_triton(table, ids.reshape(-1))


def gather_rows_into_ref(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, out_rows: torch.Tensor) -> None:
    """out[out_rows[i]] = table[ids[i]] for every i with ids[i] >= 0 (-1: nothing).

    table [R, D], out [S, D], ids / out_rows [N] int; the written out rows are distinct.
    The reference keeps the valid entries first (a data-dependent shape: a host read on a GPU)."""
    keep = ids >= 0
    rows = table.index_select(0, ids[keep].to(table.device).long())
    out.index_copy_(0, out_rows[keep].to(out.device).long(), rows.to(out.device))


def gather_rows_into(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, out_rows: torch.Tensor,
                     grid: GatherGrid | None = None) -> None:
    """Same contract as `gather_rows_into_ref`; the Triton kernel for CUDA tensors (no host
    read, fixed grid: capturable in a CUDA graph), launched as `grid` says (default:
    `GatherGrid()`): `gather_parts_into` with one table."""
    gather_parts_into([table], ids, [out], out_rows, grid)


def gather_parts_into(tables: list[torch.Tensor], ids: torch.Tensor, outs: list[torch.Tensor],
                      out_rows: torch.Tensor, grid: GatherGrid | None = None) -> None:
    """`gather_rows_into(tables[p], ids, outs[p], out_rows)` for every p: one Triton launch
    on CUDA (up to `MAX_PARTS` tables; more go in groups), the reference elsewhere."""
    if not all(t.is_cuda for t in (ids, *tables, *outs)) or not triton_importable():
        for table, out in zip(tables, outs, strict=True):
            gather_rows_into_ref(table, ids, out, out_rows)
        return
    from edgemoe.kernels.triton_ops.row_gather import MAX_PARTS, gather_parts_into_triton

    g = grid or GatherGrid()
    for i in range(0, len(tables), MAX_PARTS):
        gather_parts_into_triton(tables[i:i + MAX_PARTS], ids, outs[i:i + MAX_PARTS], out_rows,
                                 programs=g.programs, block=g.block, num_warps=g.warps)
