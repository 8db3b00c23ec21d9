"""Tile constants of the fused MoE decode kernel over quantised banks
(`triton_ops/moe_gemv_q.py`), one set per format, and their override for tuning sweeps;
Triton-free, like `moe_gemv_tiles.py`, so the override's parsing is tested without it.

A launch's program owns ROWS output rows and reduces its whole input dimension in steps
of COLS columns. A step is cut into sub-tiles of `sub_cols` columns (at most SUB_MAX),
all loaded before any is used, that accumulate into one [ROWS, sub_cols] fp32 tile: the
bytes a step keeps in flight grow with COLS, the accumulator's registers do not.
STAGES > 1 software-pipelines the step loop (Triton's `tl.range(num_stages=)`: the next
STAGES - 1 steps' loads are issued, through shared memory, while this one computes).

NOTE: every value is a constant, never derived from T: a pair's result depends only on
its token, its slot and its weight (batch invariance).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from edgemoe.kernels.tile_override import override


class MoeGemvQTiles(NamedTuple):
    gu_rows: int
    gu_cols: int
    gu_warps: int
    down_rows: int
    down_cols: int
    down_warps: int
    gu_stages: int
    down_stages: int


# Widest accumulator (columns): 16 x 128 fp32 is bf16's tuned tile (16 registers a thread
# a matrix at 4 warps); wider steps become more sub-tiles in flight, not more registers.
SUB_MAX = 128
# A gate/up step of 16 x 256 loads the bytes of bf16's 16 x 128 step at one byte a weight,
# 4 warps, one 16-byte (fp8, int8) or 4-byte (nibbles, `sub_cols`) weight load a thread a
# sub-tile. Swept on an H200 (2026-12-02, `scripts/gpu_kernel_bench.py --only moe_q_sweep`,
# bench/results/kernels-sweeps-20261202-020600.json, µs a layer at T = 1 / 8 / 32, bf16's
# then-default 35.6 / 162.5 / 520.2): fp8 gate/up 16 x 512 11.6 / 61.8 / 203.5 (16 x 256:
# 14.8 / 66.2 / 215.0), down 16 x 128 7.3 / 36.0 / 123.9 (16 x 256: 7.5 / 36.0 / 125.9); int4
# gate/up 16 x 1024 13.0 / 81.8 / 304.7 (16 x 512: 16.1 / 80.9 / 303.5), down 16 x 256 (I = 768
# is 3 such steps; 512 would leave half of the second step masked, its unpacking arithmetic
# spent on nothing): at T = 1 int4 is bound by arithmetic (18% of HBM), not bytes; int8's
# first guess stayed the best. Software pipelining (2-3 stages) lost everywhere, by 2-3x.
# mxfp4 (second round, bench/results/kernels-sweeps2-20261202-021200.log): gate/up 8 x 512
# 25.9 / 174.9 / 676.1 (16 x 1024: 35.0 / 227.1 / 880.5), down 16 x 256 18.2 / 94.6 / 363.1:
# its e2m1 decoding makes it arithmetic-bound, slower than bf16 (22.1 / 127.5 / 385.7) at
# a quarter of the bytes. sm_90 SASS at
# Qwen3-30B-A3B's shape, 16 x 256 fp8 gate/up: 87 registers, ~340 instructions a step (the
# previous kernel 219 and ~600); int4 16 x 512: 119 and ~1130 (was 255 with spills).
DEFAULTS = {
    "int8": MoeGemvQTiles(16, 256, 4, 16, 256, 4, 1, 1),
    "fp8": MoeGemvQTiles(16, 512, 4, 16, 128, 4, 1, 1),
    "int4": MoeGemvQTiles(16, 1024, 4, 16, 256, 4, 1, 1),
    "mxfp4": MoeGemvQTiles(8, 512, 4, 16, 256, 4, 1, 1),
}
POWERS_OF_TWO = ("gu_rows", "gu_cols", "gu_warps", "down_rows", "down_cols", "down_warps")  # Triton tiles
ENV = "EDGEMOE_MOE_GEMV_Q_TILES_"  # + the format's name in capitals: EDGEMOE_MOE_GEMV_Q_TILES_FP8


def env_name(fmt_name: str) -> str:
    return ENV + fmt_name.upper()


def tiles(fmt_name: str) -> MoeGemvQTiles:
    """The format's tiles; `EDGEMOE_MOE_GEMV_Q_TILES_<FORMAT>="gu_rows,gu_cols,gu_warps,
    down_rows,down_cols,down_warps[,gu_stages,down_stages]"` overrides them for tuning
    sweeps (stages keep the defaults when left out). Read per call, so a sweep can change
    it between launches."""
    name = env_name(fmt_name)
    t = override(name, DEFAULTS[fmt_name], (6, 8), "rows, cols, warps of gate_up and down, then the stages of each",
                 POWERS_OF_TWO)
    if min(t.gu_cols, t.down_cols) < 8:
        raise ValueError(f"{name}={os.environ[name]!r}: at least 8 columns a step (nibble formats unpack 4-byte words)")
    return t


def sub_cols(cols: int, rows: int, warps: int, nibbles: bool) -> int:
    """Columns of one sub-tile of a COLS-wide step (a power of two, like COLS). Nibble
    formats: rows x sub = 8 codes a thread (one 4-byte word), so the unpacked codes land in
    the layout of the activations' 16-byte loads (8 bf16 a thread); wider, Triton sends the
    activations through shared memory and two barriers every sub-tile (sm_90 SASS). At least
    8: one word."""
    sub = min(cols, SUB_MAX)
    if nibbles:
        sub = min(sub, max(8, 8 * 32 * warps // rows))
    return sub


def scale_cols(sub: int, group: int | None) -> int:
    """Columns of a sub-tile that share one scale (GW): the largest power of two dividing
    both the sub-tile width and the format's group, so each GW-wide piece of a sub-tile
    (which starts at a multiple of its width) lies in one group; the sub-tile's scales are
    a [ROWS, sub / GW] tile, broadcast over the pieces. `group` None: one scale per row
    (int8), every piece is the whole sub-tile."""
    if group is None:
        return sub
    return min(sub, group & -group)
