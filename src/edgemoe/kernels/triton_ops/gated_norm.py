"""Gated RMSNorm of the GDN output (see `kernels/gated_norm.py`): one row of D per program."""

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
    sigmoid_torch,
    silu_torch,
    tl_dtype,
)
from edgemoe.kernels.triton_ops.norm import norm_row, norm_warps


@triton.jit
def _gated_rms_norm(
    x_ptr, g_ptr, w_ptr, out_ptr, D, eps,
    stride_xm, stride_xh, stride_gm, stride_gh, stride_om, stride_oh,
    SIGMOID: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One program: head `program_id(1)` of token `program_id(0)`."""
    m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    pdl_start(USE_PDL)
    x = tl.load(x_ptr + m * stride_xm + h * stride_xh + cols, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + m * stride_gm + h * stride_gh + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    # `weight * x32.to(dtype)`: x·rstd rounded, times w in the dtype (rounded again).
    y = round_trip(norm_row(x, w, D, eps, 0.0, False, DTYPE, INTERP), DTYPE, INTERP)
    if SIGMOID:
        y = y * sigmoid_torch(g, INTERP)
    else:
        y = y * silu_torch(g, INTERP)
    tl.store(out_ptr + m * stride_om + h * stride_oh + cols, round_to(y, DTYPE, INTERP), mask=ok)


def heads_view(t: torch.Tensor) -> torch.Tensor:
    """t [..., D] as [M, H, D] (H the next-to-last dim; 1 for t [M, D]) with unit stride over D:
    a view where one exists (the GDN layer's z, a slice of the projection, has one)."""
    t3 = t.reshape(-1, t.shape[-2] if t.dim() > 2 else 1, t.shape[-1])
    return t3 if t3.stride(-1) == 1 else t3.contiguous()


def gated_rms_norm_triton(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, activation: str = "silu"
) -> torch.Tensor:
    """`gated_rms_norm_ref`'s contract (x, gate [..., D] in one dtype, weight [D] in it too):
    its cast order exactly, to one rounding of the dtype (the fp32 sum of squares' order is
    the row's layout, `norm_warps`, not torch's). One launch, one program per row of D."""
    shape, D = x.shape, x.shape[-1]
    x3, g3 = heads_view(x), heads_view(gate)
    out = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
    M, H = x3.shape[:2]
    if M and H:
        block = triton.next_power_of_2(D)
        pdl = pdl_enabled(x.device)
        _gated_rms_norm[(M, H)](
            x3, g3, weight.contiguous(), out, D, eps,
            x3.stride(0), x3.stride(1), g3.stride(0), g3.stride(1), out.stride(0), out.stride(1),
            SIGMOID=activation != "silu", DTYPE=tl_dtype(x.dtype), BLOCK=block,
            INTERP=interpreting(x), USE_PDL=pdl, launch_pdl=pdl, num_warps=norm_warps(block),
        )
    return out.view(shape)
