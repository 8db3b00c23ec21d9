"""QSA's decode block scores in one launch (contract: `kernels/qsa.decode_block_scores`):
each program scores BLOCK_B of a query's blocks straight from the index keys through the
page table (no gathered copy of the keys, no fp32 copy of them): Σ_h relu(q_h · key) / √Di,
-1 for blocks the query doesn't see yet."""

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
