"""The MoE k-sum, fused with the residual add: out[t] = residual[t] + round(sum_k cells[t, k]).

NOTE: the sum runs k = 0..K-1 in that order in fp32 and is rounded to the activation
dtype once; the residual add is then fp32(residual) + fp32(rounded), rounded once,
which is what torch's `residual + moe_out` does in bf16/fp16: bitwise equal to the
unfused torch code.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import (
    interpreting,
    pdl_start,
    round_to,
    round_trip,
    tl_dtype,
)

COMBINE_BLOCK, COMBINE_WARPS = 512, 4


@triton.jit
def _combine(
    cells_ptr, res_ptr, out_ptr, H, K, stride_ct, stride_ck, stride_rt, stride_ot,
    HAS_RES: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    pdl_start(USE_PDL)
    row = cells_ptr + t * stride_ct + cols
    acc = tl.load(row, mask=ok, other=0.0)
    for k in range(1, K):
        acc += tl.load(row + k * stride_ck, mask=ok, other=0.0)
    if HAS_RES:
        res = tl.load(res_ptr + t * stride_rt + cols, mask=ok, other=0.0).to(tl.float32)
        acc = res + round_trip(acc, DTYPE, INTERP)
    tl.store(out_ptr + t * stride_ot + cols, round_to(acc, DTYPE, INTERP), mask=ok)


def moe_combine_triton(cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor | None = None) -> torch.Tensor:
    T, K, H = cells.shape
    if cells.stride(-1) != 1:
        cells = cells.contiguous()
    out = torch.empty(T, H, dtype=dtype, device=cells.device)
    if T == 0:
        return out
    if residual is not None:
        if residual.dtype != dtype or residual.shape != (T, H):
            raise ValueError(f"residual must be [{T}, {H}] {dtype}")
        residual = residual.contiguous()
    res = residual if residual is not None else out  # unused when HAS_RES is False
    pdl = pdl_enabled(cells.device)
    _combine[(T, triton.cdiv(H, COMBINE_BLOCK))](
        cells, res, out, H, K, cells.stride(0), cells.stride(1), res.stride(0), out.stride(0),
        HAS_RES=residual is not None, DTYPE=tl_dtype(dtype), BLOCK=COMBINE_BLOCK,
        INTERP=interpreting(cells), USE_PDL=pdl, launch_pdl=pdl, num_warps=COMBINE_WARPS,
    )
    return out
