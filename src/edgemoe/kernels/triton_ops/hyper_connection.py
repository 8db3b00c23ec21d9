"""The hyper-connections' kernels (contracts in `kernels/hyper_connection.py`). Every value
is computed in fp32 and rounded to the dtype where the reference's torch op rounds its
output, so each kernel is one launch of the reference's arithmetic."""

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

MIX_BLOCK = 1024  # hc_mix's columns a program
NORM_FP_FUSION = False  # `_hc_norm`'s launch option (its NOTE); the compile check compiles with it


@triton.jit
def _hc_norm(
    h_ptr, y_ptr, g_ptr, w_ptr, n_ptr, ho_ptr, N, HC, eps, stride_h, stride_y, stride_g, stride_n, stride_ho,
    INJECT: tl.constexpr, NORM: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One (token, stream) a program: h' = h (+ round(y · g_s), rounded: INJECT), stored;
    with NORM the zero-centred RMSNorm of h' with the stream's weight slice.
    NOTE: launched with `enable_fp_fusion=False`. A product of two bf16 values is exact in
    fp32, so LLVM narrows round(h + round(y · g)) to bf16 arithmetic and then contracts it
    into one `fma.rn.bf16`, which rounds once where torch rounds twice (the H200 test saw
    one ulp on ~1 element in 7)."""
    t, s = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    pdl_start(USE_PDL)
    x = tl.load(h_ptr + t * stride_h + s * N + cols, mask=ok, other=0.0).to(tl.float32)
    if INJECT:
        y = tl.load(y_ptr + t * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + t * stride_g + s).to(tl.float32)
        x = round_trip(x + round_trip(y * g, DTYPE, INTERP), DTYPE, INTERP)  # torch: the product, then the sum
        tl.store(ho_ptr + t * stride_ho + s * N + cols, round_to(x, DTYPE, INTERP), mask=ok)
    if NORM:
        w = tl.load(w_ptr + s * N + cols, mask=ok, other=0.0).to(tl.float32)
        out = norm_row(x, w, N, eps, 1.0, True, DTYPE, INTERP)  # zero-centred: x · rstd · (1 + w)
        tl.store(n_ptr + t * stride_n + s * N + cols, round_to(out, DTYPE, INTERP), mask=ok)


def hc_norm_triton(
    h: torch.Tensor, weight: torch.Tensor | None, eps: float, hidden: int,
    inject: tuple[torch.Tensor, torch.Tensor] | None, norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, h'): see `kernels/hyper_connection.hc_norm`; norm=False: only the injection
    (n is then h', unused)."""
    T, width = h.shape
    hc = width // hidden
    h = h if h.stride(-1) == 1 else h.contiguous()
    y, g = inject if inject is not None else (h, h)
    y = y if y.stride(-1) == 1 else y.contiguous()
    g = g if g.stride(-1) == 1 else g.contiguous()
    h_out = torch.empty_like(h) if inject is not None else h
    n = torch.empty_like(h) if norm else h_out
    if T:
        block, pdl = triton.next_power_of_2(hidden), pdl_enabled(h.device)
        _hc_norm[(T, hc)](
            h, y, g, weight if weight is not None else h, n, h_out, hidden, hc, eps,
            h.stride(0), y.stride(0), g.stride(0), n.stride(0), h_out.stride(0),
            INJECT=inject is not None, NORM=norm, DTYPE=tl_dtype(h.dtype), BLOCK=block, INTERP=interpreting(h),
            USE_PDL=pdl, launch_pdl=pdl, num_warps=norm_warps(block), enable_fp_fusion=NORM_FP_FUSION,
        )
    return n, h_out


@triton.jit
def _hc_gates(
    z_ptr, a_ptr, g_ptr, R, C, stride_z, stride_a, stride_g, inv_hc,
    DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One token a program: u = round(z / hc); a = round(silu(u)) for the first R columns,
    g = 2 · round(sigmoid(u)) for the C - R after them."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    pdl_start(USE_PDL)
    z = tl.load(z_ptr + t * stride_z + cols, mask=cols < C, other=0.0).to(tl.float32)
    # NOTE: z / hc as torch divides (hc a power of two here, so the product is the quotient).
    u = round_trip(z * inv_hc, DTYPE, INTERP)
    tl.store(a_ptr + t * stride_a + cols, round_to(silu_torch(u, INTERP), DTYPE, INTERP), mask=cols < R)
    g = 2.0 * round_trip(sigmoid_torch(u, INTERP), DTYPE, INTERP)
    tl.store(g_ptr + t * stride_g + (cols - R), round_to(g, DTYPE, INTERP), mask=(cols >= R) & (cols < C))


def hc_gates_triton(z: torch.Tensor, rank: int, hc: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    T, C = z.shape
    if hc & (hc - 1):  # z / hc: a product by 1 / hc only where that is exact
        raise ValueError(f"hc_gates_triton: {hc} streams (the kernel divides by a power of two)")
    z = z if z.stride(-1) == 1 else z.contiguous()
    a = torch.empty(T, rank, dtype=z.dtype, device=z.device)
    g = torch.empty(T, C - rank, dtype=z.dtype, device=z.device) if C > rank else None
    if T:
        pdl = pdl_enabled(z.device)
        gg = g if g is not None else a
        _hc_gates[(T,)](
            z, a, gg, rank, C, z.stride(0), a.stride(0), gg.stride(0), 1.0 / hc,
            DTYPE=tl_dtype(z.dtype), BLOCK=triton.next_power_of_2(C), INTERP=interpreting(z), USE_PDL=pdl,
            launch_pdl=pdl, num_warps=4,
        )
    return a, g


@triton.jit
def _hc_mix(
    w_ptr, n_ptr, x_ptr, N, stride_w, stride_n, stride_x, inv_hc,
    HC: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    """x[t, cols] = round(Σ_s round(round(sigmoid(w_s)) · n_s) · 1/hc): torch's sigmoid, the
    product, and the mean's fp32 sum over the streams times its factor."""
    t, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    pdl_start(USE_PDL)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(HC):
        w = tl.load(w_ptr + t * stride_w + s * N + cols, mask=ok, other=0.0).to(tl.float32)
        n = tl.load(n_ptr + t * stride_n + s * N + cols, mask=ok, other=0.0).to(tl.float32)
        acc += round_trip(round_trip(sigmoid_torch(w, INTERP), DTYPE, INTERP) * n, DTYPE, INTERP)
    tl.store(x_ptr + t * stride_x + cols, round_to(acc * inv_hc, DTYPE, INTERP), mask=ok)


def hc_mix_triton(w: torch.Tensor, n: torch.Tensor, hc: int) -> torch.Tensor:
    T, width = n.shape
    hidden = width // hc
    w = w if w.stride(-1) == 1 else w.contiguous()
    n = n if n.stride(-1) == 1 else n.contiguous()
    x = torch.empty(T, hidden, dtype=n.dtype, device=n.device)
    if T:
        pdl = pdl_enabled(n.device)
        block = min(MIX_BLOCK, triton.next_power_of_2(hidden))
        _hc_mix[(T, triton.cdiv(hidden, block))](
            w, n, x, hidden, w.stride(0), n.stride(0), x.stride(0), 1.0 / hc,
            HC=hc, DTYPE=tl_dtype(n.dtype), BLOCK=block, INTERP=interpreting(n), USE_PDL=pdl, launch_pdl=pdl,
            num_warps=4,
        )
    return x
