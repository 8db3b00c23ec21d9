"""Decode attention compiled at other tile sets than the default (`EDGEMOE_ATTN_DECODE_TILES`,
the candidates of `scripts/gpu_kernel_bench.py --only attention_sweep`): software-pipelined
split loops (3, 5, 7 stages), more splits, a vectorised merge, a minimum split length, the
per-sequence choice of loop and merge chunk (both sides of LONG_BLOCKS and WIDE_SPLITS in
one batch), against the fp32 torch reference at Qwen3-30B-A3B's and Qwen3.5's shapes, with
an fp8 cache and a window; batch invariance; the pipelined loop's bits equal the plain one's. (CUDA-graph replay at new lengths at a pipelined set:
tests/gpu/test_kernels_gpu.py's replay test, parametrised over tiles.)"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from edgemoe.kernels import attn_decode_tiles
from edgemoe.kernels.attn_decode_tiles import ENV
from edgemoe.kernels.paged_attention import decode_attention_ref
from edgemoe.quant.kv import dequantise_kv, quantise_kv
from edgemoe.testing.kernel_inputs import paged_batch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
BF16 = torch.bfloat16
# The adaptive loops' opt-in set (pipelined from 4 blocks, wide merge from 32 live splits).
ADAPTIVE = "64,64,4,2,8,1,4,5,32,64"
# The default (one loop), the adaptive set and variants, and 4-6 value forms (one loop, one
# merge chunk: the pre-adaptive kernel at those tiles).
TILES = ["", ADAPTIVE, "64,64,4,2,8,1,4,2,32,8", "64,64,4,2,8,1,2,5,16,32", "128,32,4,2,8,2,8,5,32,128", "128,32,4,7,32,1",
         "256,16,2,5,64,1", "128,32,4,5,32,4", "64,128,8,5,16,1"]
# At ADAPTIVE (64 splits of 64-key blocks, pipelined from 4 blocks, wide from 32 live
# splits): 1000 (16 one-block splits: plain, small chunk), 4097 (33 two-block splits: plain,
# wide), 20000 and 32768 (5 and 8 blocks a split: pipelined, wide).
LENS = [1, 17, 513, 1000, 4097, 20000, 32768]


def decode(b, window, k=None, v=None, ks=None, vs=None) -> torch.Tensor:  # noqa: ANN001
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    out = torch.full_like(b.q, float("nan"))  # poisoned: every row must be written
    return decode_attention_triton(b.q, b.k_cache if k is None else k, b.v_cache if v is None else v, b.page_table,
                                   b.req_rows, b.seq_lens, b.page_size, b.q.shape[-1] ** -0.5, window, out, None, ks,
                                   vs)


def check(got: torch.Tensor, b, window, k: torch.Tensor, v: torch.Tensor) -> None:  # noqa: ANN001
    # Against fp32 over the same (dequantised) cache: the kernel rounds the probabilities to
    # bf16 (<= 2^-9 relative each, so <= 2^-9 max|v| on the weighted sum) and the output
    # (<= 2^-9 |out|): 2^-7 max|v|.
    want = decode_attention_ref(b.q.float(), k.float(), v.float(), b.page_table, b.req_rows, b.seq_lens, b.page_size,
                                b.q.shape[-1] ** -0.5, window, torch.empty(b.q.shape, device=b.q.device))
    assert not got.isnan().any()
    assert (got.float() - want).abs().max() <= 2**-7 * v.float().abs().max()


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize(("hq", "hkv", "d", "page_size", "window"), [(32, 4, 128, 16, None), (16, 2, 256, 16, 3000)])
def test_decode_at_sweep_tiles(tiles: str, hq: int, hkv: int, d: int, page_size: int, window: int | None,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, tiles)
    b = paged_batch(LENS, [1] * len(LENS), hq, hkv, d, page_size, BF16, "cuda", seed=d + hq)
    got = decode(b, window)
    check(got, b, window, b.k_cache, b.v_cache)
    for i in (3, 5):  # the 1000- and 20000-key sequences alone: the bits they had in the batch
        one = slice(i, i + 1)
        alone = dataclasses.replace(b, q=b.q[one], req_rows=b.req_rows[one], seq_lens=b.seq_lens[one])
        assert torch.equal(decode(alone, window)[0].view(torch.int16), got[i].view(torch.int16))


def test_pipelined_split_loop_is_the_plain_ones_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE: the two split loops differ only in num_stages (loads moved ahead): ADAPTIVE
    (pipelined from long_blocks) and one plain loop everywhere, at the same merge, agree bit for bit."""
    b = paged_batch(LENS, [1] * len(LENS), 32, 4, 128, 16, BF16, "cuda", seed=5)
    monkeypatch.setenv(ENV, ADAPTIVE)
    got = decode(b, None)
    adaptive = attn_decode_tiles.tiles()
    monkeypatch.setenv(ENV, ",".join(map(str, adaptive._replace(long_stages=adaptive.stages))))
    assert torch.equal(decode(b, None).view(torch.int16), got.view(torch.int16))


@pytest.mark.parametrize("tiles", ["", ADAPTIVE, "64,64,4,5,8,1", "128,32,4,7,32,2"])
def test_decode_fp8_cache_at_pipelined_tiles(tiles: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, tiles)
    b = paged_batch(LENS, [1] * len(LENS), 32, 4, 128, 16, BF16, "cuda", seed=3)
    (kq, ks), (vq, vs) = quantise_kv(b.k_cache), quantise_kv(b.v_cache)
    for window in (None, 700):
        got = decode(b, window, kq, vq, ks, vs)
        check(got, b, window, dequantise_kv(kq, ks, torch.float32), dequantise_kv(vq, vs, torch.float32))
