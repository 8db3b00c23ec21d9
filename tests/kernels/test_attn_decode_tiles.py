"""Decode attention's tile settings (`attn_decode_tiles`): the override's parsing, and the
Triton kernels (interpreter on CPU) at other tile sets than the default against the torch
reference: more splits than key blocks, several merge steps, blocks wider than the
context, a minimum split length, odd head groups, page sizes 1 and 16, a window, fp8 KV."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels import attn_decode_tiles
from edgemoe.kernels.attn_decode_tiles import AttnDecodeTiles, block_n_for, merge_warps, tiles
from edgemoe.kernels.paged_attention import decode_attention_ref
from edgemoe.quant.kv import dequantise_kv, quantise_kv
from edgemoe.testing.kernel_inputs import paged_batch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def test_override_takes_four_to_six_or_ten_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(attn_decode_tiles.ENV, raising=False)
    assert tiles() == attn_decode_tiles.DEFAULT
    # the old forms keep their meaning: one loop at `stages`, one merge chunk
    long_blocks, wide_splits = attn_decode_tiles.LONG_BLOCKS, attn_decode_tiles.WIDE_SPLITS
    monkeypatch.setenv(attn_decode_tiles.ENV, "128,32,2,5")
    chunk = attn_decode_tiles.MERGE_CHUNK
    assert tiles() == (128, 32, 2, 5, chunk, attn_decode_tiles.MIN_BLOCKS, long_blocks, 5, wide_splits, chunk)
    monkeypatch.setenv(attn_decode_tiles.ENV, "256,16,8,7,64,3")
    assert tiles() == (256, 16, 8, 7, 64, 3, long_blocks, 7, wide_splits, 64)
    monkeypatch.setenv(attn_decode_tiles.ENV, "64,64,4,2,8,1,6,5,20,32")
    t = tiles()
    assert (t.long_blocks, t.long_stages, t.wide_splits, t.wide_chunk) == (6, 5, 20, 32)
    for bad in ("64,64,4", "64,64,4,2,8,1,1", "64,64,4,2,8,1,4,5,32", "64,64,4,0", "64,x,4,2"):
        monkeypatch.setenv(attn_decode_tiles.ENV, bad)
        with pytest.raises(ValueError, match="4, 5, 6 or 10 positive integers"):
            tiles()
    for bad in ("64,48,4,2", "64,8,4,2", "64,64,3,2", "64,64,4,2,12", "64,64,4,2,8,1,4,5,32,48"):
        monkeypatch.setenv(attn_decode_tiles.ENV, bad)
        with pytest.raises(ValueError, match="powers of two"):
            tiles()


def test_wide_rows_take_their_own_tiles_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows padded to 512+ dims (MLA's 576) take WIDE_HEAD, or SHARED_ROW where the launch
    loads the row in its parts, and the memory plan's workspace counts the larger of their
    splits (either may run: an fp8 latent cache takes the generic split); an override (a
    sweep) sets every head dim's."""
    from edgemoe.kernels.attn_decode_tiles import SHARED_ROW, WIDE_HEAD, split_workspace_bytes, tiles_for

    monkeypatch.delenv(attn_decode_tiles.ENV, raising=False)
    assert [tiles_for(d) for d in (64, 128, 256, 257)] == [tiles()] * 3 + [WIDE_HEAD]
    assert [tiles_for(d, shared_row=True) for d in (128, 576)] == [tiles(), SHARED_ROW]
    assert tiles_for(576) == WIDE_HEAD and WIDE_HEAD.warps == 8 and block_n_for(WIDE_HEAD, 576) == 16
    assert SHARED_ROW.splits <= WIDE_HEAD.splits and SHARED_ROW.wide_chunk == 64
    assert split_workspace_bytes(2, 20, 576) == 2 * 20 * WIDE_HEAD.splits * 577 * 4
    monkeypatch.setenv(attn_decode_tiles.ENV, "32,16,2,5")
    assert tiles_for(576) == tiles_for(576, shared_row=True) == tiles() and tiles().splits == 32


def test_block_and_merge_warps_by_head_dim() -> None:
    t = AttnDecodeTiles(64, 64, 4, 2, 8, 1, 4, 2, 32, 8)
    assert [block_n_for(t, d) for d in (64, 128, 256)] == [64, 64, 32]  # a D=256 tile: the bytes of D=128's
    assert block_n_for(t._replace(block_n=16), 256) == 16  # tl.dot's least
    # the widest merge tile [chunk, D] at <= 32 fp32 values a thread
    assert [merge_warps(t._replace(merge_chunk=c, wide_chunk=c), 128) for c in (1, 8, 16, 64, 256)] == [1, 1, 2, 8, 8]
    assert merge_warps(t._replace(wide_chunk=32), 128) == 4


# (tiles, Hq, Hkv, D, page_size, window, dtype, fp8 cache): every tile set runs the same
# lengths (a lone token, one partial block, 331 and 611: multiples of nothing used here).
CASES = [
    # 32 splits of one 16-key block each (most splits past the end), merged 4 at a step
    ("32,16,2,5,4,1", 5, 1, 64, 16, None, torch.bfloat16, False),
    # a 128-key block wider than most contexts, page size 1, one merge step of 16
    ("16,128,8,5,16,1", 6, 3, 64, 1, None, torch.float32, False),
    # splits of at least 3 blocks (few splits), a window that starts mid-split, chunk 2
    ("8,32,4,7,2,3", 9, 3, 64, 16, 50, torch.bfloat16, False),
    # fp8 cache, many splits, a window, a merge chunk of one split
    ("64,16,4,3,1,1", 4, 1, 128, 16, 100, torch.bfloat16, True),
]


@needs_triton
@pytest.mark.parametrize(("tile_env", "hq", "hkv", "d", "page_size", "window", "dtype", "fp8"), CASES)
def test_triton_decode_at_other_tiles(
    monkeypatch: pytest.MonkeyPatch, tile_env: str, hq: int, hkv: int, d: int, page_size: int, window: int | None,
    dtype: torch.dtype, fp8: bool,
) -> None:
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    monkeypatch.setenv(attn_decode_tiles.ENV, tile_env)
    b = paged_batch([1, 13, 331, 611], [1] * 4, hq, hkv, d, page_size, dtype, seed=hq + d + page_size)
    k, v, ks, vs = b.k_cache, b.v_cache, None, None
    if fp8:
        (k, ks), (v, vs) = quantise_kv(b.k_cache), quantise_kv(b.v_cache)
    kd, vd = (dequantise_kv(k, ks, torch.float32), dequantise_kv(v, vs, torch.float32)) if fp8 else (k, v)
    args = (b.page_table, b.req_rows, b.seq_lens, page_size, d**-0.5, window)
    got = decode_attention_triton(b.q, k, v, *args, torch.full_like(b.q, float("nan")), None, ks, vs)  # poisoned
    want = decode_attention_ref(b.q.float(), kd.float(), vd.float(), *args, torch.empty(b.q.shape))
    # fp32: sums in another order (~1e-6 relative). bf16: the kernel rounds the probabilities
    # (2^-9 relative each, so <= 2^-9 max|v| on the weighted sum) and the output (<= 2^-9 |out|): 2^-7 max|v|, x2.
    rel = {torch.float32: 2e-6, torch.bfloat16: 2**-7}[dtype]
    assert not got.isnan().any()
    assert (got.float() - want).abs().max() <= rel * vd.float().abs().max()
    # batch invariance at these tiles too: a sequence alone gives the bits it gives in the batch
    alone = decode_attention_triton(b.q[3:], k, v, b.page_table, b.req_rows[3:], b.seq_lens[3:], page_size, d**-0.5,
                                    window, torch.empty_like(b.q[3:]), None, ks, vs)
    assert torch.equal(alone[0], got[3])


# Small tiles that put both loops and both merges in one batch: 8 splits of 16-key blocks,
# the pipelined loop from 2 blocks a split, the wide merge (chunk 8) from 4 live splits.
# Lengths (split length; live splits; blocks a split): 40 (16; 3; 1: plain, chunk 2),
# 64 (16; 4; 1: plain, wide), 200 (32; 7; 2, the last 1: both loops, wide), 611 (80; 8; 5,
# the last 4), 5 (one key).
ADAPTIVE = "8,16,4,1,2,1,2,3,4,8"
ADAPTIVE_LENS = [40, 64, 200, 611, 5]


@needs_triton
@pytest.mark.parametrize(("window", "fp8"), [(None, False), (150, True)])
def test_triton_decode_adapts_per_sequence(monkeypatch: pytest.MonkeyPatch, window: int | None, fp8: bool) -> None:
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    b = paged_batch(ADAPTIVE_LENS, [1] * 5, 4, 2, 64, 16, torch.bfloat16, seed=21)
    k, v, ks, vs = b.k_cache, b.v_cache, None, None
    if fp8:
        (k, ks), (v, vs) = quantise_kv(b.k_cache), quantise_kv(b.v_cache)
    kd, vd = (dequantise_kv(k, ks, torch.float32), dequantise_kv(v, vs, torch.float32)) if fp8 else (k, v)

    def run(rows: slice) -> torch.Tensor:
        out = torch.full_like(b.q[rows], float("nan"))  # poisoned: every row must be written
        return decode_attention_triton(b.q[rows], k, v, b.page_table, b.req_rows[rows], b.seq_lens[rows], 16, 0.125,
                                       window, out, None, ks, vs)

    monkeypatch.setenv(attn_decode_tiles.ENV, ADAPTIVE)
    got = run(slice(0, 5))
    want = decode_attention_ref(b.q.float(), kd.float(), vd.float(), b.page_table, b.req_rows, b.seq_lens, 16, 0.125,
                                window, torch.empty(b.q.shape))
    # bf16: the probabilities' rounding (2^-9 relative each: <= 2^-9 max|v| on the weighted
    # sum) and the output's (<= 2^-9 |out|): 2^-7 max|v| with room for the sum order.
    assert (got.float() - want).abs().max() <= 2**-7 * vd.float().abs().max()
    # batch invariance: a short row and a long one alone give the bits they give mixed
    for i in (0, 3):
        assert torch.equal(run(slice(i, i + 1))[0], got[i])
    # the pipelined loop is the plain one's arithmetic: one loop everywhere, same merges, same bits
    monkeypatch.setenv(attn_decode_tiles.ENV, "8,16,4,1,2,1,2,1,4,8")
    assert torch.equal(run(slice(0, 5)), got)
