"""The MoE k-sum, fused with the residual add: out[t] = residual[t] + round(sum_k cells[t, k]).

NOTE: the sum runs k = 0..K-1 in that order in fp32 and is rounded to the activation
dtype once; the residual add is then fp32(residual) + fp32(rounded), rounded once,
which is what torch's `residual + moe_out` does in bf16/fp16: bitwise equal to the
unfused torch code.

Both read a pair's cell where `kernels/cell_sources.py` says when given sources: 0 for a
pair that routes nothing, the CPU share's mailbox row for a CPU pair — after spinning
until the CPU is done where the sources name the bell's turn (`triton_ops/host_words.py`).

`moe_combine_norm_triton` also writes the next layer's input RMSNorm of that row (one
program per token row, the whole row in registers): the norm is `triton_ops/norm.py`'s
`norm_row` on the rounded row, launched with the norm kernel's BLOCK and warps, so it is
bitwise what `rms_norm_triton` computes from the stored h.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.cell_sources import CellSources
from edgemoe.kernels.triton_ops.common import (
    interpreting,
    pdl_start,
    round_to,
    round_trip,
    tl_dtype,
)
from edgemoe.kernels.triton_ops.host_words import await_value
from edgemoe.kernels.triton_ops.norm import norm_row, norm_warps

COMBINE_BLOCK, COMBINE_WARPS = 512, 4


@triton.jit
def _cell(cells_row, k, stride_ck, cols, keep, col_ptr, cpu_ptr, pair, H, HAS_CPU: tl.constexpr):
    """Pair `pair` (= t·K + k)'s cell where `keep` (its row is live, the column in range;
    else 0): the buffer's, or the CPU mailbox's row where the CPU computed it
    (`kernels/cell_sources.py`)."""
    if HAS_CPU:
        c = tl.load(col_ptr + pair).to(tl.int64)
        v = tl.load(cells_row + k * stride_ck, mask=keep & (c < 0), other=0.0)
        cpu = tl.load(cpu_ptr + c * H + cols, mask=keep & (c >= 0), other=0.0)
        return tl.where(c >= 0, cpu, v)
    return tl.load(cells_row + k * stride_ck, mask=keep, other=0.0)


@triton.jit
def _live(ok, dead_ptr, t, HAS_DEAD: tl.constexpr):
    """`ok` where row t is live (a padding row's cells read as 0)."""
    if HAS_DEAD:
        return ok & (tl.load(dead_ptr + t) == 0)
    return ok


@triton.jit
def _await_cpu(ready_ptr, ready_value, INTERP: tl.constexpr, WAIT: tl.constexpr):
    """Where the sources name the bell's turn: spin until the CPU's cells are written."""
    if WAIT:
        await_value(ready_ptr, ready_value, INTERP)


def _source_args(sources: CellSources | None, cells: torch.Tensor, T: int) -> tuple:
    """(dead, cpu_col, cpu_out, ready word, ready value, HAS_DEAD, HAS_CPU, WAIT) launch
    arguments (cells as the unused pointers' stand-in)."""
    dead = sources.dead if sources is not None else None
    col = sources.cpu_col if sources is not None else None
    ready = sources.ready if sources is not None else None
    if dead is not None:
        assert dead.shape == (T,) and dead.dtype == torch.bool
    if col is not None:
        assert sources.cpu_out is not None and col.numel() >= T * cells.shape[1]
        assert sources.cpu_out.dtype == torch.float32
    return (dead if dead is not None else cells, col if col is not None else cells,
            sources.cpu_out if col is not None else cells, ready.done if ready is not None else cells,
            ready.value if ready is not None else 0, dead is not None, col is not None, ready is not None)


@triton.jit
def _combine(
    cells_ptr, res_ptr, out_ptr, dead_ptr, col_ptr, cpu_ptr, ready_ptr, ready_value, H, K, stride_ct, stride_ck,
    stride_rt, stride_ot, HAS_RES: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr,
    USE_PDL: tl.constexpr, HAS_DEAD: tl.constexpr, HAS_CPU: tl.constexpr, WAIT: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    pdl_start(USE_PDL)
    _await_cpu(ready_ptr, ready_value, INTERP, WAIT)
    row = cells_ptr + t * stride_ct + cols
    keep = _live(ok, dead_ptr, t, HAS_DEAD)
    acc = _cell(row, 0, stride_ck, cols, keep, col_ptr, cpu_ptr, t * K, H, HAS_CPU)
    for k in range(1, K):
        acc += _cell(row, k, stride_ck, cols, keep, col_ptr, cpu_ptr, t * K + k, H, HAS_CPU)
    if HAS_RES:
        res = tl.load(res_ptr + t * stride_rt + cols, mask=ok, other=0.0).to(tl.float32)
        acc = res + round_trip(acc, DTYPE, INTERP)
    tl.store(out_ptr + t * stride_ot + cols, round_to(acc, DTYPE, INTERP), mask=ok)


def moe_combine_triton(cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor | None = None,
                       sources: CellSources | None = None) -> torch.Tensor:
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
    dead, col, cpu, ready, value, has_dead, has_cpu, wait = _source_args(sources, cells, T)
    _combine[(T, triton.cdiv(H, COMBINE_BLOCK))](
        cells, res, out, dead, col, cpu, ready, value, H, K, cells.stride(0), cells.stride(1), res.stride(0),
        out.stride(0), HAS_RES=residual is not None, DTYPE=tl_dtype(dtype), BLOCK=COMBINE_BLOCK,
        INTERP=interpreting(cells), USE_PDL=pdl, HAS_DEAD=has_dead, HAS_CPU=has_cpu, WAIT=wait, launch_pdl=pdl,
        num_warps=COMBINE_WARPS,
    )
    return out


@triton.jit
def _combine_norm(
    cells_ptr, res_ptr, w_ptr, out_ptr, normed_ptr, dead_ptr, col_ptr, cpu_ptr, ready_ptr, ready_value, H, eps,
    weight_offset, stride_ct, stride_ck, stride_rt, stride_ot, stride_nt,
    K: tl.constexpr, OFFSET: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr,
    USE_PDL: tl.constexpr, HAS_DEAD: tl.constexpr, HAS_CPU: tl.constexpr, WAIT: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    pdl_start(USE_PDL)
    _await_cpu(ready_ptr, ready_value, INTERP, WAIT)
    row = cells_ptr + t * stride_ct + cols
    # K constexpr: the K loads of a row are all in flight at once (one program per row
    # would otherwise wait on them one by one); the sum still runs k = 0..K-1.
    keep = _live(ok, dead_ptr, t, HAS_DEAD)
    acc = _cell(row, 0, stride_ck, cols, keep, col_ptr, cpu_ptr, t * K, H, HAS_CPU)
    for k in tl.static_range(1, K):
        acc += _cell(row, k, stride_ck, cols, keep, col_ptr, cpu_ptr, t * K + k, H, HAS_CPU)
    res = tl.load(res_ptr + t * stride_rt + cols, mask=ok, other=0.0).to(tl.float32)
    h = round_trip(res + round_trip(acc, DTYPE, INTERP), DTYPE, INTERP)  # the stored h, in fp32 (masked: 0)
    tl.store(out_ptr + t * stride_ot + cols, round_to(h, DTYPE, INTERP), mask=ok)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = norm_row(h, w, H, eps, weight_offset, OFFSET, DTYPE, INTERP)
    tl.store(normed_ptr + t * stride_nt + cols, round_to(normed, DTYPE, INTERP), mask=ok)


def moe_combine_norm_triton(
    cells: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    weight_offset: float, sources: CellSources | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, rms_norm(h)) with h = residual + round(sum_k cells): cells [T, K, H] fp32 (with
    `sources`' cells read where they are), residual [T, H] and weight [H] in `dtype`."""
    T, K, H = cells.shape
    if cells.stride(-1) != 1:
        cells = cells.contiguous()
    if residual.dtype != dtype or residual.shape != (T, H) or weight.dtype != dtype or weight.shape != (H,):
        raise ValueError(f"residual must be [{T}, {H}] and weight [{H}], both {dtype}")
    residual, weight = residual.contiguous(), weight.contiguous()
    out = torch.empty(T, H, dtype=dtype, device=cells.device)
    normed = torch.empty_like(out)
    if T == 0:
        return out, normed
    block = triton.next_power_of_2(H)  # NOTE: rms_norm_triton's BLOCK and warps (`norm_warps`)
    pdl = pdl_enabled(cells.device)
    dead, col, cpu, ready, value, has_dead, has_cpu, wait = _source_args(sources, cells, T)
    _combine_norm[(T,)](
        cells, residual, weight, out, normed, dead, col, cpu, ready, value, H, eps, weight_offset,
        cells.stride(0), cells.stride(1), residual.stride(0), out.stride(0), normed.stride(0),
        K=K, OFFSET=weight_offset != 0.0, DTYPE=tl_dtype(dtype), BLOCK=block, INTERP=interpreting(cells),
        USE_PDL=pdl, HAS_DEAD=has_dead, HAS_CPU=has_cpu, WAIT=wait, launch_pdl=pdl, num_warps=norm_warps(block),
    )
    return out, normed
