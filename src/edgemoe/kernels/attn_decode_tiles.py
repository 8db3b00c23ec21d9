"""Tile constants of paged decode attention (`triton_ops/attn_decode.py`) and their override
for tuning sweeps, kept free of Triton so the memory plan (`engine/budget.py`) can size the
kernel's split workspace without importing it.

NOTE: every value is a constant, never derived from the batch or the context: a sequence's
split cut depends only on its own length (batch invariance), and the grid and the workspace
(B x Hq x SPLITS x (D + 1) fp32) only on the batch size, so one CUDA graph holds both
launches at any context.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from edgemoe.kernels.tile_override import override

# Measured on an H200 (2026-12-01, CUDA-graph replay, 32/4 heads x 128, bf16): 6.8 µs at
# B=1 1K, 33.2 at B=1 32K (48% of HBM), 35.5 at B=8 4K. NOTE: with STAGES = 2 the split
# kernel's loop is not software-pipelined in effect (one K/V buffer, the page ids loaded
# synchronously before it: two memory round trips per key block); Triton 3.6 moves the
# page ids two blocks ahead from 3 stages and double-buffers K/V from 5
# (`scripts/gpu_kernel_bench.py --only attention_sweep` measures the candidates).
SPLITS = 64  # splits of each sequence's context: the grid's third axis, the workspace's
BLOCK_N = 64  # keys per block at head_dim <= 128; halved above (the same bytes per K/V tile)
WARPS = 4
STAGES = 2
MERGE_CHUNK = 8  # splits the merge reads per step, as one [chunk, D] tile
MIN_BLOCKS = 1  # a split holds at least this many key blocks (fewer, longer splits at short contexts)
ENV = "EDGEMOE_ATTN_DECODE_TILES"
FIELDS = "splits,block_n,warps,stages[,merge_chunk[,min_blocks]]"


class AttnDecodeTiles(NamedTuple):
    splits: int
    block_n: int
    warps: int
    stages: int
    merge_chunk: int
    min_blocks: int


DEFAULT = AttnDecodeTiles(SPLITS, BLOCK_N, WARPS, STAGES, MERGE_CHUNK, MIN_BLOCKS)


def tiles() -> AttnDecodeTiles:
    """The tile constants; `EDGEMOE_ATTN_DECODE_TILES="splits,block_n,warps,stages[,merge_chunk
    [,min_blocks]]"` overrides them for tuning sweeps (the missing ones keep their defaults).
    Read per call, so a sweep can change it between launches (each value set compiles once)."""
    t = override(ENV, DEFAULT, (4, 5, 6), FIELDS, ("block_n", "warps", "merge_chunk"))
    if t.block_n < 16:  # tl.dot wants 16 keys at least
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: block_n must be one of the powers of two >= 16")
    return t


def block_n_for(t: AttnDecodeTiles, head_dim: int) -> int:
    """Keys per block at this head dim: half above 128, so a K or V tile of D = 256 takes
    the bytes of one at 128 (the ~99 KiB of shared memory of sm_86/sm_89 blocks bounds
    the buffered tiles)."""
    return t.block_n if head_dim <= 128 else max(16, t.block_n // 2)


def merge_warps(t: AttnDecodeTiles, d_pad: int) -> int:
    """Warps of a merge program: its [merge_chunk, D] fp32 tile at <= 32 values a thread."""
    return min(8, max(1, t.merge_chunk * d_pad // 1024))


def split_workspace_bytes(rows: int, q_heads: int, head_dim: int) -> int:
    """Device bytes of the split outputs and LSEs (fp32) one decode launch over `rows`
    sequences allocates."""
    return rows * q_heads * tiles().splits * (head_dim + 1) * 4
