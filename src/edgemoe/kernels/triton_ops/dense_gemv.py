"""Weight-streaming GEMV for decode-sized batches: y = x @ W.T, W [N, K] (nn.Linear layout).

At M <= 32 tokens a dense projection is pure weight bandwidth (Qwen3-30B-A3B's fused qkv
is 5120 x 2048 bf16 = 21 MB, read once a step), so the kernel is the bf16 MoE decode
GEMV's step (`moe_gemv.py`, 87% of HBM at T = 1 on an H200) applied to a dense weight:
a program owns ROWS output rows and a block of TOKENS tokens, streams its rows along K
COLS columns a step (`weight_tile`: one vector load a thread), and multiplies each tile
by every token of its block, the token's activations loaded straight into the tile's
register layout (`gemv_x_tile`: no shared memory, no barriers). Each token has its own
fp32 [ROWS, COLS] accumulator, reduced over COLS once at the end and rounded once to x's
dtype. It replaced a tensor-core kernel (tl.dot over 16-token blocks, 0.93x cuBLAS on the
decode shapes): an MMA tile pads a token to 16 rows and went through shared memory.

The grid is 1-D with a row tile's token blocks adjacent (program = row tile x blocks +
block): for M > TOKENS they run together, so a W tile comes from HBM once and from L2 for
the other blocks. No split-K: a weight with few row tiles (o_proj, N = 2048) gets fewer
rows a program (`dense_gemv_tiles.rows_for`), as many programs without a second pass.

NOTE (batch invariance): ROWS, COLS, TOKENS, the warps and stages are constants
(`dense_gemv_tiles.py`; ROWS a function of N only), never derived from M, and M is not
specialised: a token's row is the same products summed in the same order whichever slot
of whichever block it lands in, so its output is bitwise the same at any M and whatever
the other rows hold. Tokens past M skip their work (a uniform branch), and add nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.dense_gemv_tiles import DenseGemvTiles, check, rows_for, tiles
from edgemoe.kernels.triton_ops.common import interpreting, pdl_start, round_to, tl_dtype
from edgemoe.kernels.triton_ops.moe_common import gemv_x_tile
from edgemoe.kernels.triton_ops.moe_gemv import weight_tile


@triton.jit
def _token_fma(acc, w, x_ptr, tok, M, stride_xm, c0, K, ROWS: tl.constexpr, COLS: tl.constexpr):
    """acc + w * token `tok`'s activations [c0, c0 + COLS) in w's layout; a token past M
    (the last block's padding) leaves acc as it is and loads nothing."""
    if tok < M:
        acc += w * gemv_x_tile(x_ptr, tok, stride_xm, c0, K, ROWS, COLS)
    return acc


@triton.jit
def _store_token(out_ptr, acc, bias, tok, M, stride_om, rows, row_ok, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """Token `tok`'s output rows: its [ROWS, COLS] products summed over COLS, plus the rows'
    `bias` (fp32 [ROWS]; zeros without one), rounded once (`out_ptr`: the program's first row)."""
    y = round_to(tl.sum(acc, axis=1) + bias, DTYPE, INTERP)
    tl.store(out_ptr + tok.to(tl.int64) * stride_om + rows, y, mask=row_ok & (tok < M))


# NOTE: M and the block count are not specialised (Triton would compile M == 1 apart):
# one compiled kernel serves every batch size, so no M can pick different code for a row.
@triton.jit(do_not_specialize=["M", "blocks"])
def _dense_gemv(
    x_ptr, w_ptr, out_ptr, M, N, K, blocks, stride_xm, stride_wn, stride_om, b_ptr,
    DTYPE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, TOKENS: tl.constexpr,
    STAGES: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr, HAS_BIAS: tl.constexpr = False,
):
    pid = tl.program_id(0)
    t0 = (pid % blocks) * TOKENS
    row0 = (pid // blocks) * ROWS
    # NOTE: W is never written by a kernel and could stream before the wait; the loop
    # loads x and W together, so the wait comes first.
    pdl_start(USE_PDL)
    rows = tl.arange(0, ROWS)
    row_ok = row0 + rows < N
    bank = w_ptr + row0.to(tl.int64) * stride_wn
    # One accumulator a token of the block (TOKENS <= 8); the unused ones fold away.
    acc0 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc1 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc2 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc3 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc4 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc5 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc6 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    acc7 = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for c0 in tl.range(0, K, COLS, num_stages=STAGES):
        w = weight_tile(bank, rows, row_ok, c0, K, stride_wn, COLS)  # loaded once for the block
        acc0 += w * gemv_x_tile(x_ptr, t0, stride_xm, c0, K, ROWS, COLS)  # t0 < M: a block's first token is real
        if TOKENS > 1:
            acc1 = _token_fma(acc1, w, x_ptr, t0 + 1, M, stride_xm, c0, K, ROWS, COLS)
        if TOKENS > 2:
            acc2 = _token_fma(acc2, w, x_ptr, t0 + 2, M, stride_xm, c0, K, ROWS, COLS)
            acc3 = _token_fma(acc3, w, x_ptr, t0 + 3, M, stride_xm, c0, K, ROWS, COLS)
        if TOKENS > 4:
            acc4 = _token_fma(acc4, w, x_ptr, t0 + 4, M, stride_xm, c0, K, ROWS, COLS)
            acc5 = _token_fma(acc5, w, x_ptr, t0 + 5, M, stride_xm, c0, K, ROWS, COLS)
            acc6 = _token_fma(acc6, w, x_ptr, t0 + 6, M, stride_xm, c0, K, ROWS, COLS)
            acc7 = _token_fma(acc7, w, x_ptr, t0 + 7, M, stride_xm, c0, K, ROWS, COLS)
    out = out_ptr + row0
    # The projection's bias (q/k/v's, o's: GLM, gpt-oss) added before the rounding, as F.linear does.
    b = tl.zeros([ROWS], dtype=tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + row0 + rows, mask=row_ok, other=0.0).to(tl.float32)
    _store_token(out, acc0, b, t0, M, stride_om, rows, row_ok, DTYPE, INTERP)
    if TOKENS > 1:
        _store_token(out, acc1, b, t0 + 1, M, stride_om, rows, row_ok, DTYPE, INTERP)
    if TOKENS > 2:
        _store_token(out, acc2, b, t0 + 2, M, stride_om, rows, row_ok, DTYPE, INTERP)
        _store_token(out, acc3, b, t0 + 3, M, stride_om, rows, row_ok, DTYPE, INTERP)
    if TOKENS > 4:
        _store_token(out, acc4, b, t0 + 4, M, stride_om, rows, row_ok, DTYPE, INTERP)
        _store_token(out, acc5, b, t0 + 5, M, stride_om, rows, row_ok, DTYPE, INTERP)
        _store_token(out, acc6, b, t0 + 6, M, stride_om, rows, row_ok, DTYPE, INTERP)
        _store_token(out, acc7, b, t0 + 7, M, stride_om, rows, row_ok, DTYPE, INTERP)


def dense_gemv_triton(x: torch.Tensor, w: torch.Tensor, t: DenseGemvTiles | None = None,
                      bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] , w [N, K] (same dtype) → [M, N] in x's dtype, fp32 accumulation, plus
    `bias` [N] (any float dtype), one rounding. `t`: the tiles (default
    `dense_gemv_tiles.tiles()`, which a sweep overrides). Capturable: no host sync, one
    launch, the output from torch's allocator. `out_dtype` float32 with an fp32 `w` (a
    sigmoid router's, `router_sigmoid.router_logits`): x upcast exactly, fp32 products and
    sums, no rounding: `F.linear(x.float(), w)`'s terms summed in this kernel's order."""
    t = tiles() if t is None else t
    check(t)
    M, K = x.shape
    N = w.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if w.stride(-1) != 1:
        w = w.contiguous()
    out = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    if bias is not None and (bias.shape != (N,) or bias.stride(0) != 1):
        raise ValueError(f"bias must be [{N}] and contiguous, got {tuple(bias.shape)}")
    rows = rows_for(N, t)
    blocks = triton.cdiv(M, t.tokens)
    pdl = pdl_enabled(x.device)
    _dense_gemv[(triton.cdiv(N, rows) * blocks,)](
        x, w, out, M, N, K, blocks, x.stride(0), w.stride(0), out.stride(0), x if bias is None else bias,
        DTYPE=tl_dtype(out.dtype), ROWS=rows, COLS=t.cols, TOKENS=t.tokens, STAGES=t.stages,
        INTERP=interpreting(x), USE_PDL=pdl, launch_pdl=pdl, num_warps=t.warps, HAS_BIAS=bias is not None,
    )
    return out
