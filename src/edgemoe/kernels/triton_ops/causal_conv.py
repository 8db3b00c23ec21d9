"""The decode step of the depthwise causal conv (see `kernels/causal_conv.py`): one launch for
the gather, the K-tap sum, the activation and the state pool's in-place shift; and torch's
SiLU from `common.py`."""

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
    silu_torch,
    tl_dtype,
)

CONV_BLOCK = 256  # channels per program: Qwen3-Next's 8192 q|k|v channels make 32 programs a sequence
CONV_FP_FUSION = False  # `_conv_update`'s launch option (its NOTE); the compile check compiles with it


@triton.jit
def _conv_update(
    x_ptr, w_ptr, b_ptr, pool_ptr, idx_ptr, init_ptr, out_ptr, C,
    stride_x, stride_w, stride_pr, stride_pc, stride_ps, stride_o,
    TAPS: tl.constexpr, DIL: tl.constexpr, S: tl.constexpr, SP: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_INIT: tl.constexpr, SILU: tl.constexpr,
    X_DTYPE: tl.constexpr, POOL_DTYPE: tl.constexpr, BLOCK: tl.constexpr,
    INTERP: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One program: sequence `program_id(0)`, channels of block `program_id(1)`. The window is
    the S state columns (rounded to x's dtype) then x; tap j reads column S - (K-1-j)·DIL."""
    seq = tl.program_id(0).to(tl.int64)
    chans = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = chans < C
    pdl_start(USE_PDL)
    row = pool_ptr + tl.load(idx_ptr + seq).to(tl.int64) * stride_pr
    live = ok  # channels whose state is read: a fresh sequence's reads as zeros
    if HAS_INIT:
        live = ok & (tl.load(init_ptr + seq) != 0)
    x = tl.load(x_ptr + seq * stride_x + chans, mask=ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TAPS):  # the reference's order: products rounded, then added
        col = S - (TAPS - 1 - j) * DIL  # a constexpr: static_range and constexpr arithmetic
        if col == S:
            v = x
        else:
            v = tl.load(row + chans * stride_pc + col * stride_ps, mask=live, other=0.0).to(tl.float32)
            v = round_trip(v, X_DTYPE, INTERP)
        acc += tl.load(w_ptr + chans * stride_w + j, mask=ok, other=0.0).to(tl.float32) * v
    if HAS_BIAS:
        acc += tl.load(b_ptr + chans, mask=ok, other=0.0).to(tl.float32)
    if SILU:
        acc = silu_torch(acc, INTERP)
    tl.store(out_ptr + seq * stride_o + chans, round_to(acc, X_DTYPE, INTERP), mask=ok)
    # The window [C, S + 1] written back without its oldest column: column i goes to state column i-1.
    cols = tl.arange(0, SP)[None, :]
    cells = row + chans[:, None] * stride_pc + cols * stride_ps
    win = tl.load(cells, mask=live[:, None] & (cols < S), other=0.0).to(tl.float32)
    win = tl.where(cols == S, x[:, None], round_trip(win, X_DTYPE, INTERP))
    # NOTE: the shift crosses threads (the thread that stores column i-1 need not be the one
    # that loaded it): every load of the row must be done before the first store.
    tl.debug_barrier()
    tl.store(cells - stride_ps, round_to(win, POOL_DTYPE, INTERP), mask=ok[:, None] & (cols >= 1) & (cols <= S))


def conv_silu(activation: str | None) -> bool:
    """Whether `activation` is SiLU (the reference's `_activate` names: silu, swish, None)."""
    if activation is None:
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"unsupported conv activation {activation!r} (silu or None)")


def causal_conv1d_update_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_pool: torch.Tensor,
    state_idx: torch.Tensor, *, has_initial_state: torch.Tensor | None = None, activation: str | None = "silu",
    dilation: int = 1,
) -> torch.Tensor:
    """`causal_conv1d_update_ref`'s contract, bitwise (its fp32 order and roundings; the SiLU
    with CUDA's expf): x [B, C], weight [C, K], conv_pool [rows, C, S] with S ≥ (K-1)·dilation.
    One launch of B × ⌈C / CONV_BLOCK⌉ programs; no host sync, capturable in a CUDA graph.

    NOTE: launched with `enable_fp_fusion=False`: the reference rounds each tap's product
    before adding it, and a fused multiply-add would not.
    """
    B, C = x.shape
    taps, history = weight.shape[1], conv_pool.shape[-1]
    assert history >= (taps - 1) * dilation, f"conv state of {history} inputs < (K-1)·d = {(taps - 1) * dilation}"
    silu = conv_silu(activation)
    if x.stride(-1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    out = torch.empty((B, C), dtype=x.dtype, device=x.device)
    if B == 0:
        return out
    init = x if has_initial_state is None else has_initial_state.to(torch.bool).contiguous().view(torch.uint8)
    pdl = pdl_enabled(x.device)
    _conv_update[(B, triton.cdiv(C, CONV_BLOCK))](
        x, weight, x if bias is None else bias.contiguous(), conv_pool, state_idx.contiguous(), init, out, C,
        x.stride(0), weight.stride(0), *conv_pool.stride(), out.stride(0),
        TAPS=taps, DIL=dilation, S=history, SP=triton.next_power_of_2(history + 1),
        HAS_BIAS=bias is not None, HAS_INIT=has_initial_state is not None, SILU=silu,
        X_DTYPE=tl_dtype(x.dtype), POOL_DTYPE=tl_dtype(conv_pool.dtype), BLOCK=CONV_BLOCK,
        INTERP=interpreting(x), USE_PDL=pdl, launch_pdl=pdl, num_warps=4, enable_fp_fusion=CONV_FP_FUSION,
    )
    return out
