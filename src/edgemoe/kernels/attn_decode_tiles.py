"""Tile constants of paged decode attention (`triton_ops/attn_decode.py`) and their override
for tuning sweeps, kept free of Triton so the memory plan (`engine/budget.py`) can size the
kernel's split workspace without importing it.

NOTE: every value is a constant, never derived from the batch or the context: a sequence's
split cut depends only on its own length (batch invariance), and the grid and the workspace
(B x Hq x SPLITS x (D + 1) fp32) only on the batch size, so one CUDA graph holds both
launches at any context. Which split loop and which merge chunk a sequence takes is chosen
inside the kernels from its own length (its split's key blocks, its live splits) against
the LONG_BLOCKS / WIDE_SPLITS thresholds: deterministic, batch-invariant, graph-safe.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from edgemoe.kernels.tile_override import override

# Measured on an H200 (2026-12-02, CUDA-graph replay, 32/4 heads x 128, bf16, µs a layer;
# docs/benchmarks.md): one split geometry (64 splits of 64-key blocks) and, per sequence by
# its own length, two loops and two merges. NOTE: a split loop at 2 stages is not
# software-pipelined in effect (one K/V buffer, the page ids loaded synchronously before it:
# two memory round trips per key block); Triton 3.6 moves the page ids two blocks ahead from
# 3 stages and double-buffers K/V from 5. Pipelining wins 4-20 µs at 32K-128K (splits of 8-32
# blocks) but costs on splits of one block (+1.8 µs at B=1 1K: the prologue is pure latency;
# +10 at B=8 4K, where its 72 KiB of shared memory also cuts the programs an SM holds):
# splits of >= LONG_BLOCKS blocks take the pipelined loop, the others the plain one. NOTE:
# the shared memory is the kernel's, so short splits keep that occupancy cost.
# Likewise a merge of all 64 splits in one step wins 2-4 µs at 8K-32K (64 live splits) but
# costs 0.9 at 1K (16): sequences with >= WIDE_SPLITS live splits merge WIDE_CHUNK at a step.
# Default: the adaptive loops OFF (LONG_STAGES = STAGES and WIDE_CHUNK = MERGE_CHUNK compile
# one loop and one merge, the pre-adaptive kernel). In the whole engine (resident
# random:qwen3-30b-a3b, batch 1, bench/results/decode-20261202-0330*.json, -032909) the
# adaptive set 64,64,4,2,8,1,4,5,32,64 decoded 1K at 301.6-306.1 tok/s against 319.1 with one
# loop (the pipelined loop's 72 KiB of shared memory is reserved for every program, short
# splits included), and 32K at 240.4 against 228.3. 1K is the target still missed (issue 12),
# so long-context deployments opt in: EDGEMOE_ATTN_DECODE_TILES=64,64,4,2,8,1,4,5,32,64.
SPLITS = 64  # splits of each sequence's context: the grid's third axis, the workspace's
BLOCK_N = 64  # keys per block at head_dim <= 128; halved above (the same bytes per K/V tile)
WARPS = 4
STAGES = 2  # the plain split loop's (a split of fewer than LONG_BLOCKS key blocks)
MERGE_CHUNK = 8  # splits the merge reads per step, as one [chunk, D] tile (fewer than WIDE_SPLITS live)
MIN_BLOCKS = 1  # a split holds at least this many key blocks (fewer, longer splits at short contexts)
LONG_BLOCKS = 4  # a split of this many key blocks or more takes the pipelined loop (8K: 2, 32K: 8)
LONG_STAGES = STAGES  # the pipelined split loop's stages (5 when opted in; = STAGES: one loop)
WIDE_SPLITS = 32  # a sequence of this many live splits or more merges WIDE_CHUNK a step (1K: 16, 8K: 64)
WIDE_CHUNK = MERGE_CHUNK  # the wide merge's chunk (64 when opted in; = MERGE_CHUNK: one merge loop)
ENV = "EDGEMOE_ATTN_DECODE_TILES"
FIELDS = "splits,block_n,warps,stages[,merge_chunk[,min_blocks[,long_blocks,long_stages,wide_splits,wide_chunk]]]"


class AttnDecodeTiles(NamedTuple):
    splits: int
    block_n: int
    warps: int
    stages: int
    merge_chunk: int
    min_blocks: int
    long_blocks: int
    long_stages: int
    wide_splits: int
    wide_chunk: int


DEFAULT = AttnDecodeTiles(SPLITS, BLOCK_N, WARPS, STAGES, MERGE_CHUNK, MIN_BLOCKS, LONG_BLOCKS, LONG_STAGES,
                          WIDE_SPLITS, WIDE_CHUNK)
# Rows padded to 512 dims or more (MLA's one latent head of 576, padded to 1,024): the default's
# [16+, 1,024] fp32 accumulator over 4 warps spills, and one kv head gives a sequence only
# SPLITS programs. Measured on an H100 (2026-12-06, CUDA-graph replay, 20 query heads over one
# 576-wide shared K/V row, bf16; bench/results/kernels-mla-attn-sweep-h100-20261206.json), µs a
# layer at B=1 1K / 8K / 32K / 128K and B=8 4K: the default 137 / 357 / 1,148 / 4,316 / 1,211;
# 8 warps and 16-key blocks at 64 splits 18 / 54 / 169 / 628 / 116, at 128 splits 23 / 49 /
# 109 / 340 / 157 (taken: a long single context is an agent's), at 32 splits 19 / 88 / 321 /
# 1,244 / 98.
WIDE_HEAD = AttnDecodeTiles(128, 32, 8, 2, MERGE_CHUNK, MIN_BLOCKS, LONG_BLOCKS, 2, WIDE_SPLITS, MERGE_CHUNK)
WIDE_HEAD_DIM = 512  # rows padded to this many dims or more take WIDE_HEAD
# Such a row when V is K and it is loaded in its two power-of-two parts
# (`triton_ops/attn_decode_shared.py`: MLA's bf16 latent cache): no padded tile to spill, so
# the default geometry, its merge 64 splits a step from 32 live. Measured on an H100
# (2026-12-06 15:39, CUDA-graph replay, 20 query heads over one 576-wide row; the split and
# the merge, µs at B=1 1K / 8K / 32K / 128K and B=8 4K): 10.8 / 22.6 / 64.9 / 234.8 / 48.6
# against the default merge's 12.4 / 27.6 / 70.2 / 243.7 / 52.5; in the engine WIDE_HEAD
# over the shared split took 7.8 + 9.8 µs a layer at 1K (its merge of 128 splits the most).
SHARED_ROW = AttnDecodeTiles(SPLITS, BLOCK_N, WARPS, STAGES, MERGE_CHUNK, MIN_BLOCKS, LONG_BLOCKS, STAGES, 32, 64)


def tiles() -> AttnDecodeTiles:
    """The tile constants; `EDGEMOE_ATTN_DECODE_TILES="splits,block_n,warps,stages[,merge_chunk
    [,min_blocks[,long_blocks,long_stages,wide_splits,wide_chunk]]]"` overrides them for tuning
    sweeps. The pre-adaptive 4-6 value forms keep their meaning, one loop at `stages` and one
    merge chunk (long_stages = stages, wide_chunk = merge_chunk), their other fields the
    defaults. Read per call, so a sweep can change it between launches (each set compiles once)."""
    t = override(ENV, DEFAULT, (4, 5, 6, 10), FIELDS, ("block_n", "warps", "merge_chunk", "wide_chunk"))
    if len(os.environ.get(ENV, "").split(",")) in (4, 5, 6):
        t = t._replace(long_stages=t.stages, wide_chunk=t.merge_chunk)
    if t.block_n < 16:  # tl.dot wants 16 keys at least
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: block_n must be one of the powers of two >= 16")
    return t


def tiles_for(head_dim: int, shared_row: bool = False) -> AttnDecodeTiles:
    """The tiles at this head dim: `tiles()` (the override, else the default), or for rows
    padded to WIDE_HEAD_DIM or more when nothing is overridden SHARED_ROW where the launch
    loads the row in parts (`shared_row`: `attn_decode_shared.takes_shared_split`), else
    WIDE_HEAD."""
    if os.environ.get(ENV) or _padded(head_dim) < WIDE_HEAD_DIM:
        return tiles()
    return SHARED_ROW if shared_row else WIDE_HEAD


def _padded(head_dim: int) -> int:
    return 1 << max(0, head_dim - 1).bit_length()


def block_n_for(t: AttnDecodeTiles, head_dim: int) -> int:
    """Keys per block at this head dim: half above 128, so a K or V tile of D = 256 takes
    the bytes of one at 128 (the ~99 KiB of shared memory of sm_86/sm_89 blocks bounds
    the buffered tiles)."""
    return t.block_n if head_dim <= 128 else max(16, t.block_n // 2)


def merge_warps(t: AttnDecodeTiles, d_pad: int) -> int:
    """Warps of a merge program: its widest [chunk, D] fp32 tile at <= 32 values a thread
    (one launch serves both chunks: the wide one sizes it)."""
    return min(8, max(1, max(t.merge_chunk, t.wide_chunk) * d_pad // 1024))


def split_workspace_bytes(rows: int, q_heads: int, head_dim: int) -> int:
    """Device bytes of the split outputs and LSEs (fp32) one decode launch over `rows`
    sequences allocates."""
    splits = max(tiles_for(head_dim).splits, tiles_for(head_dim, shared_row=True).splits)  # either launch
    return rows * q_heads * splits * (head_dim + 1) * 4
