"""RMSNorm rows, optionally after the residual add (see `kernels/norm_fused.py`)."""

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


def norm_warps(block: int) -> int:
    """Warps of a one-row-per-program norm of `block` (a power of 2) columns.
    NOTE: the fp32 sum of squares' reduction tree follows the row's layout (BLOCK and
    warps): a kernel that fuses this norm (`moe_combine.py`, `router.py`) launches with the
    same pair, so its output is bitwise this kernel's."""
    return min(16, max(1, block // 256))


@triton.jit
def norm_row(x, w, N, eps, weight_offset, OFFSET: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """The RMSNorm of one row x [BLOCK] fp32 (holding DTYPE values; masked columns 0) with
    weight w [BLOCK] fp32, in fp32 before the output's final rounding to DTYPE."""
    return norm_scale(x, norm_rstd(x, N, eps), w, weight_offset, OFFSET, DTYPE, INTERP)


@triton.jit
def norm_rstd(x, N, eps):
    """rsqrt(mean(x^2) + eps) of one row x [BLOCK] fp32 (masked columns 0): the fp32 sum's
    order follows x's layout (see `norm_warps`)."""
    return tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)


@triton.jit
def norm_scale(x, rstd, w, weight_offset, OFFSET: tl.constexpr, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """x · rstd scaled by the weight w (elementwise: any columns of the row, any layout)."""
    y = x * rstd
    if OFFSET:
        out = y * (weight_offset + w)  # fp32 product, one rounding (Qwen3-Next order)
    else:
        out = round_trip(y, DTYPE, INTERP) * w  # round, then scale in the dtype (Llama order)
    return out


@triton.jit
def _rms_norm(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, N, eps, weight_offset,
    stride_x, stride_r, stride_o, stride_nr,
    HAS_RES: tl.constexpr, OFFSET: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
    INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    pdl_start(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        x = round_trip(r + x, DTYPE, INTERP)  # torch's `residual + x` in the dtype
        tl.store(new_res_ptr + row * stride_nr + cols, round_to(x, DTYPE, INTERP), mask=ok)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    out = norm_row(x, w, N, eps, weight_offset, OFFSET, DTYPE, INTERP)
    tl.store(out_ptr + row * stride_o + cols, round_to(out, DTYPE, INTERP), mask=ok)


def rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    shape, N = x.shape, x.shape[-1]
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    new_res = None
    res2 = x2  # unused when HAS_RES is False
    if residual is not None:
        res2 = residual.reshape(-1, N)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        new_res = torch.empty_like(out)
    rows = x2.shape[0]
    if rows:
        block = triton.next_power_of_2(N)
        pdl = pdl_enabled(x.device)
        _rms_norm[(rows,)](
            x2, res2, weight.contiguous(), out, new_res if new_res is not None else out, N, eps, weight_offset,
            x2.stride(0), res2.stride(0), out.stride(0), out.stride(0),
            HAS_RES=residual is not None, OFFSET=weight_offset != 0.0, DTYPE=tl_dtype(x.dtype), BLOCK=block,
            INTERP=interpreting(x), USE_PDL=pdl, launch_pdl=pdl, num_warps=norm_warps(block),
        )
    return out.view(shape), None if new_res is None else new_res.view(shape)
