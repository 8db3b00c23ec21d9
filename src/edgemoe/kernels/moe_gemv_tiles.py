"""Tile constants of the fused MoE decode kernel (`triton_ops/moe_gemv.py`) and their
override for tuning sweeps, kept free of Triton so the memory plan (`engine/budget.py`)
can size the kernel's split-K partials without importing it.

NOTE: every value is a constant, never derived from T: a pair's result depends only on
its token, its slot and its weight (batch invariance).
"""

from __future__ import annotations

from typing import NamedTuple

from edgemoe.kernels.tile_override import override

# Output rows per program and reduction width per step. Swept on an H200 with the
# activations loaded in the weight tile's layout (2026-12-02, `scripts/gpu_kernel_bench.py
# --only moe_sweep`, bench/results/kernels-sweeps-20261202-020600.json, µs a layer at T = 1 / 8 / 32,
# weights rotated past L2): gate/up 16 x 256 at 4 warps 13.8 / 81.8 / 245.8 (87% / 95% / 68%
# of HBM) against the previous 16 x 128's 26.1 / 109.3 / 355.8 (16 x 128 held the activations
# in shared memory, where wider steps lost); down 8 x 128 at 4 warps 8.1 / 44.6 / 138.5
# against 16 x 128's 9.5 / 53.3 / 164.4 (twice the programs: H = 2048 / 8 = 256 a pair).
GU_ROWS, GU_COLS, GU_WARPS = 16, 256, 4
DOWN_ROWS, DOWN_COLS, DOWN_WARPS = 8, 128, 4
# Split-K of the gate/up launch: S programs per row tile, each reducing 1/S of H into fp32
# partials that the down launch sums (more bytes in flight at T = 1). 1 = no split, the
# original two kernels. Swept on an H200 (2026-12-01, bench/results/kernels-splitk-20261201-215300.json,
# µs per layer at T = 1 / 8 / 32): S=1 28.9 / 133.3 / 373.3, S=2 27.5 / 153.6 / 479.3, S=4 28.7 /
# 159.8 / 520.4, S=8 33.1 / 183.7 / 633.0. S must not depend on T (batch invariance) and S=2's 5%
# at T = 1 costs 15-28% at T = 8-32, so no split: the T = 1 grid's shortfall is not loads in flight.
GU_SPLITS = 1
# Software pipelining of each launch's step loop (`tl.range(num_stages=)`: the next
# STAGES - 1 steps' weight and activation loads go out as async copies into shared memory
# while this step computes). 1 = off: the kernel as it was (Triton pipelines no loop of
# this kernel without it, whatever the launch's num_stages). Swept with the rest: 2 and 3
# stages lose at every T (16 x 128: 37.5 / 25.6 µs gate/up at T = 1 against 26.1 at 1 stage);
# the fp32 sums are the same at any value.
GU_STAGES, DOWN_STAGES = 1, 1
ENV = "EDGEMOE_MOE_GEMV_TILES"
POWERS_OF_TWO = ("gu_rows", "gu_cols", "gu_warps", "down_rows", "down_cols", "down_warps")  # Triton tiles


class MoeGemvTiles(NamedTuple):
    gu_rows: int
    gu_cols: int
    gu_warps: int
    down_rows: int
    down_cols: int
    down_warps: int
    gu_splits: int
    gu_stages: int = GU_STAGES
    down_stages: int = DOWN_STAGES


DEFAULT = MoeGemvTiles(GU_ROWS, GU_COLS, GU_WARPS, DOWN_ROWS, DOWN_COLS, DOWN_WARPS, GU_SPLITS, GU_STAGES, DOWN_STAGES)


def tiles() -> MoeGemvTiles:
    """The tile constants; `EDGEMOE_MOE_GEMV_TILES="gu_rows,gu_cols,gu_warps,down_rows,
    down_cols,down_warps[,gu_splits[,gu_stages,down_stages]]"` overrides them for tuning
    sweeps (values left out keep DEFAULT's). Read per call, so a sweep can change it
    between launches."""
    return override(ENV, DEFAULT, (6, 7, 9), "rows, cols, warps of gate_up and down, then gate_up splits, then "
                    "the stages of gate_up and down", POWERS_OF_TWO)


def split_cols(H: int, splits: int, cols: int) -> int:
    """Columns of H each gate/up split reduces: H / splits rounded up to whole COLS tiles,
    so every split starts on a tile boundary (aligned, vectorised loads); the last splits
    may get fewer columns, or none when H is small (their partials are zeros)."""
    per_split = -(-H // splits)
    return -(-per_split // cols) * cols


def split_partials_bytes(pairs: int, inter: int) -> int:
    """Device bytes of the fp32 split-K partials [pairs, S, 2, I] one decode launch
    allocates (0 without a split: then the intermediate is [pairs, I] in the activation
    dtype, as before)."""
    splits = tiles().gu_splits
    return 0 if splits == 1 else pairs * splits * 2 * inter * 4
