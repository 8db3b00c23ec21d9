"""Tile constants of the dense decode GEMV (`triton_ops/dense_gemv.py`) and their override
for tuning sweeps, kept free of Triton (like `moe_gemv_tiles.py`) so the sweep and the
tests can name them without compiling anything.

A program owns `rows` output rows of W [N, K] and a block of `tokens` tokens; it streams
its rows along K, `cols` columns a step, and multiplies each weight tile by every token of
its block (one fp32 [rows, cols] accumulator a token).

NOTE (batch invariance): every value is a constant, and the row count a weight runs with
(`rows_for`) is a function of its N only, never of M: a token's output row is computed by
the same instructions in the same order whatever M is and whatever the other rows hold.
"""

from __future__ import annotations

from typing import NamedTuple

from edgemoe.kernels.tile_override import override

# Swept on an H200 (2026-12-02, `scripts/gpu_dense_gemv_sweep.py`, 8 candidates,
# bench/results/dense-gemv-sweep-20261202-032800.json, µs against cuBLAS): the best batch-1
# step is 4 rows x 1024 columns, 4 warps, 1 token a block: qkv 8.40 vs 8.47, o_proj 7.08 vs
# 9.67 (1.36x: cuBLAS splits K and adds a reduce), the LM head 170.6 vs 166.0; 914 µs of
# dense projections a step against cuBLAS's 1,037. From M = 2 every candidate loses (0.85x
# at best, 0.1-0.5x from M = 4: the per-token re-reads of each weight tile are not served
# from L2), and one kernel must serve every M (batch invariance), so `--dense-kernel`
# stays torch by default.
ROWS, COLS, WARPS, TOKENS = 4, 1024, 4, 1
# Halve the rows of a program (down to 1) while the weight has fewer row tiles than this
# (a function of N only; at 4 rows every weight here has >= 512 row tiles).
MIN_ROW_TILES = 256
# Software pipelining of the K loop (`tl.range(num_stages=)`); 1 = off, which the MoE
# decode GEMV's sweep found fastest at every T. The fp32 sums do not depend on it.
STAGES = 1
MAX_TOKENS_BLOCK = 8  # the kernel holds at most 8 accumulators (one a token of the block)
ENV = "EDGEMOE_DENSE_GEMV_TILES"
POWERS_OF_TWO = ("rows", "cols", "warps", "tokens")  # Triton tiles (tokens: 1, 2, 4 or 8)


class DenseGemvTiles(NamedTuple):
    rows: int
    cols: int
    warps: int
    tokens: int
    min_row_tiles: int = MIN_ROW_TILES
    stages: int = STAGES

    def label(self) -> str:
        """The override string that selects these tiles."""
        return ",".join(map(str, self))


DEFAULT = DenseGemvTiles(ROWS, COLS, WARPS, TOKENS, MIN_ROW_TILES, STAGES)


def tiles() -> DenseGemvTiles:
    """The tile constants; `EDGEMOE_DENSE_GEMV_TILES="rows,cols,warps,tokens[,min_row_tiles
    [,stages]]"` overrides them for tuning sweeps (values left out keep DEFAULT's). Read per
    call, so a sweep can change it between launches."""
    t = override(ENV, DEFAULT, (4, 5, 6), "rows, cols, warps, tokens a block, then min row tiles, then stages",
                 POWERS_OF_TWO)
    check(t)
    return t


def check(t: DenseGemvTiles) -> None:
    """Refuse a token block the kernel cannot hold."""
    if t.tokens > MAX_TOKENS_BLOCK:
        raise ValueError(f"dense GEMV tiles {t.label()}: at most {MAX_TOKENS_BLOCK} tokens a block")


def rows_for(n: int, t: DenseGemvTiles) -> int:
    """Output rows per program for a weight of n rows: t.rows, halved while the weight
    would have fewer than t.min_row_tiles row tiles (never below 1). NOTE: N only."""
    rows = t.rows
    while rows > 1 and -(-n // rows) < t.min_row_tiles:
        rows //= 2
    return rows
