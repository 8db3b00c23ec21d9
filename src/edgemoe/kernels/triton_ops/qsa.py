"""QSA's decode kernels (contracts in `kernels/qsa.py`):

- the block scores in one launch: each program scores BLOCK_B of a query's blocks straight
  from the index keys through the page table (no gathered copy of the keys, no fp32 copy of
  them): Σ_h relu(q_h · key) / √Di, -1 for blocks the query doesn't see yet;
- the selection as a page table of `ratio`-token pages in one launch (the paged decode
  attention kernel then reads exactly the selected tokens)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import interpreting, mma, pdl_start

BLOCK_B = 64  # blocks a program: at 128K context and ratio 4, 512 programs a query


@triton.jit
def _block_scores(
    q_ptr, k_ptr, pt_ptr, rows_ptr, vis_ptr, out_ptr, HI, DI, NB, page_size, ratio, sqrt_d,
    stride_qn, stride_qh, stride_k, stride_pt, stride_on,
    HI_PAD: tl.constexpr, DI_PAD: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    n, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    blocks = c * BLOCK + tl.arange(0, BLOCK)
    heads, dims = tl.arange(0, HI_PAD), tl.arange(0, DI_PAD)
    pdl_start(USE_PDL)
    row = tl.load(rows_ptr + n).to(tl.int64)
    ends = blocks.to(tl.int64) * ratio + ratio - 1  # a block's key sits at its last position's slot
    in_table = blocks < NB
    pages = tl.load(pt_ptr + row * stride_pt + ends // page_size, mask=in_table, other=0).to(tl.int64)
    slots = pages * page_size + ends % page_size
    keys = tl.load(k_ptr + slots[None, :] * stride_k + dims[:, None], mask=in_table[None, :] & (dims < DI)[:, None],
                   other=0.0)  # [DI_PAD, BLOCK]
    q = tl.load(q_ptr + n * stride_qn + heads[:, None] * stride_qh + dims[None, :],
                mask=(heads < HI)[:, None] & (dims < DI)[None, :], other=0.0)  # [HI_PAD, DI_PAD]
    dots = mma(q, keys, tl.zeros([HI_PAD, BLOCK], tl.float32), INTERP)  # exact products, fp32 sums
    score = tl.sum(tl.maximum(dots, 0.0), axis=0) / sqrt_d  # padded heads are 0: relu adds nothing
    score = tl.where(blocks < tl.load(vis_ptr + n), score, -1.0)
    tl.store(out_ptr + n * stride_on + blocks, score, mask=in_table)


def block_scores_triton(
    qi: torch.Tensor, index_k: torch.Tensor, page_table: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor,
    num_blocks: int, page_size: int, ratio: int,
) -> torch.Tensor:
    """qi [n, Hi, Di], index_k [S, Di] (qi's dtype), rows / visible [n] → scores [n, NB] fp32."""
    n, hi, di = qi.shape
    qi = qi if qi.stride(-1) == 1 else qi.contiguous()
    out = torch.empty(n, num_blocks, dtype=torch.float32, device=qi.device)
    if n and num_blocks:
        pdl = pdl_enabled(qi.device)
        _block_scores[(n, triton.cdiv(num_blocks, BLOCK_B))](
            qi, index_k, page_table, rows.contiguous(), visible.contiguous(), out, hi, di, num_blocks, page_size,
            ratio, math.sqrt(di), qi.stride(0), qi.stride(1), index_k.stride(0), page_table.stride(0), out.stride(0),
            HI_PAD=max(16, triton.next_power_of_2(hi)), DI_PAD=max(16, triton.next_power_of_2(di)), BLOCK=BLOCK_B,
            INTERP=interpreting(qi), USE_PDL=pdl, launch_pdl=pdl, num_warps=4,
        )
    return out


@triton.jit
def _selected_table(
    blocks_ptr, pos_ptr, rows_ptr, pt_ptr, table_ptr, len_ptr, K, page_size, ratio, stride_b, stride_pt, stride_t,
    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One query a program: its valid blocks (id < visible) as pages in column order, then its
    tail's page, and its length (contract: `kernels/qsa.selected_page_table_ref`)."""
    n = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    pdl_start(USE_PDL)
    pos = tl.load(pos_ptr + n).to(tl.int64)
    row = tl.load(rows_ptr + n).to(tl.int64)
    visible = (pos + 1) // ratio
    block = tl.load(blocks_ptr + n * stride_b + j, mask=j < K, other=0).to(tl.int64)
    valid = (j < K) & (block < visible)
    rank = tl.cumsum(valid.to(tl.int32), axis=0) - valid.to(tl.int32)
    start = block * ratio
    page = tl.load(pt_ptr + row * stride_pt + start // page_size, mask=valid, other=0).to(tl.int64)
    first_slot = page * page_size + start % page_size
    tl.store(table_ptr + n * stride_t + rank, (first_slot // ratio).to(tl.int32), mask=valid)
    used = tl.sum(valid.to(tl.int32), axis=0)
    tail = pos // ratio * ratio  # the tail's block (in the page table even when the tail is empty)
    tail_page = tl.load(pt_ptr + row * stride_pt + tail // page_size).to(tl.int64)
    tl.store(table_ptr + n * stride_t + used, ((tail_page * page_size + tail % page_size) // ratio).to(tl.int32))
    tl.store(len_ptr + n, (used * ratio + pos + 1 - visible * ratio).to(tl.int32))


def selected_page_table_triton(
    positions: torch.Tensor, rows: torch.Tensor, blocks: torch.Tensor, page_table: torch.Tensor, page_size: int,
    ratio: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(table [n, k+1] int32, lengths [n] int32); a table's columns past length / ratio are
    not written."""
    n, k = blocks.shape
    table = torch.empty(n, k + 1, dtype=torch.int32, device=blocks.device)
    lengths = torch.empty(n, dtype=torch.int32, device=blocks.device)
    if n:
        blocks = blocks if blocks.stride(-1) == 1 else blocks.contiguous()
        pdl = pdl_enabled(blocks.device)
        _selected_table[(n,)](
            blocks, positions.contiguous(), rows.contiguous(), page_table, table, lengths, k, page_size, ratio,
            blocks.stride(0), page_table.stride(0), table.stride(0),
            BLOCK_K=triton.next_power_of_2(max(k, 1)), USE_PDL=pdl, launch_pdl=pdl, num_warps=4,
        )
    return table, lengths
