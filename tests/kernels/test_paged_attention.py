"""Batched paged attention: the references against the per-sequence reference of
`attention.py`, and the Triton kernels (interpreter on CPU) against the references."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.attention import paged_attention_ref
from edgemoe.kernels.paged_attention import decode_attention_ref, extend_attention_ref
from edgemoe.testing.kernel_inputs import PagedBatch, paged_batch

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def slots_by_hand(b: PagedBatch, seq: int) -> torch.Tensor:
    """Context slots of sequence `seq`, walked page by page in plain Python."""
    row, ctx = int(b.req_rows[seq]), int(b.seq_lens[seq])
    return torch.tensor([int(b.page_table[row, p // b.page_size]) * b.page_size + p % b.page_size for p in range(ctx)])


@pytest.mark.parametrize("page_size", [1, 4])
def test_refs_match_per_sequence_reference(page_size: int) -> None:
    b = paged_batch([9, 14, 5], [3, 14, 1], 4, 2, 8, page_size, torch.float32, seed=1)
    scale = 8**-0.5
    got = extend_attention_ref(b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.cu_seqlens_q, b.seq_lens,
                               b.page_size, scale, 6, b.max_q_len)
    cu = b.cu_seqlens_q.tolist()
    for seq in range(3):
        want = paged_attention_ref(b.q, b.k_cache, b.v_cache, cu[seq], cu[seq + 1] - cu[seq], slots_by_hand(b, seq),
                                   scale, 6)
        assert torch.equal(got[cu[seq] : cu[seq + 1]], want)
    d = paged_batch([9, 14, 5], [1, 1, 1], 4, 2, 8, page_size, torch.float32, seed=2)
    out = decode_attention_ref(d.q, d.k_cache, d.v_cache, d.page_table, d.req_rows, d.seq_lens, d.page_size, scale,
                               None, torch.empty_like(d.q))
    for seq in range(3):
        assert torch.equal(out[seq : seq + 1], paged_attention_ref(d.q, d.k_cache, d.v_cache, seq, 1,
                                                                  slots_by_hand(d, seq), scale))


def fp32_reference(b: PagedBatch, window: int | None, decode: bool) -> torch.Tensor:
    f = lambda t: t.float()  # noqa: E731
    scale = b.q.shape[-1] ** -0.5
    if decode:
        return decode_attention_ref(f(b.q), f(b.k_cache), f(b.v_cache), b.page_table, b.req_rows, b.seq_lens,
                                    b.page_size, scale, window, torch.empty(b.q.shape))
    return extend_attention_ref(f(b.q), f(b.k_cache), f(b.v_cache), b.page_table, b.req_rows, b.cu_seqlens_q,
                                b.seq_lens, b.page_size, scale, window, b.max_q_len)


def assert_attention_close(got: torch.Tensor, want: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Against the fp32 reference. bf16/fp16: the kernel rounds the probabilities (<= 2^-9
    relative each, so <= 2^-9 max|v| on the weighted sum) and the output (<= 2^-9 |out|);
    bound 2^-7 max|v| (x2 margin). fp32: sums in another order, ~1e-6 relative."""
    rel = {torch.float32: 2e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}[got.dtype]
    assert not got.isnan().any()
    assert (got.float() - want).abs().max() <= rel * v_cache.float().abs().max()


CASES = [  # Hq, Hkv, D, page_size, window
    (6, 2, 64, 16, None),
    (5, 1, 64, 1, None),
    (4, 4, 128, 64, None),
    (6, 2, 64, 16, 300),
    (2, 1, 256, 16, 40),
]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv", "d", "page_size", "window"), CASES)
def test_triton_decode(dtype: torch.dtype, hq: int, hkv: int, d: int, page_size: int, window: int | None) -> None:
    from edgemoe.kernels.attn_decode_tiles import SPLITS
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    lens = [64 * SPLITS + 77, 130, 1]  # splits of two blocks (a partial one), one block, a lone token
    b = paged_batch(lens, [1, 1, 1], hq, hkv, d, page_size, dtype, seed=d + hq)
    out = torch.full_like(b.q, float("nan"))  # poisoned: every row must be written
    decode_attention_triton(b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.seq_lens, page_size, d**-0.5,
                            window, out)
    assert_attention_close(out, fp32_reference(b, window, decode=True), b.v_cache)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv", "d", "page_size", "window"), CASES)
def test_triton_extend(dtype: torch.dtype, hq: int, hkv: int, d: int, page_size: int, window: int | None) -> None:
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    # A chunk after a cached prefix (two query blocks), a whole prompt, a single token.
    b = paged_batch([150, 70, 9], [80, 70, 1], hq, hkv, d, page_size, dtype, seed=d + hq + 1)
    out = extend_attention_triton(b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.cu_seqlens_q, b.seq_lens,
                                  page_size, d**-0.5, window, b.max_q_len)
    assert_attention_close(out, fp32_reference(b, window, decode=False), b.v_cache)


@needs_triton
@pytest.mark.parametrize("window", [None, 50])
def test_triton_extend_chunking_invariant(window: int | None) -> None:
    # A token's output must not depend on how its prompt was chunked or what shares the
    # batch: 100 tokens at once vs. the last 37 as a chunk beside another sequence.
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    whole = paged_batch([100], [100], 4, 2, 64, 16, torch.bfloat16, seed=9)
    out = extend_attention_triton(whole.q, whole.k_cache, whole.v_cache, whole.page_table, whole.req_rows,
                                  whole.cu_seqlens_q, whole.seq_lens, 16, 0.125, window, 100)
    q = torch.cat((torch.randn(5, 4, 64).to(torch.bfloat16), whole.q[63:]))
    table = torch.cat((whole.page_table, whole.page_table[whole.req_rows.long()]))  # another row, same pages
    rows = torch.tensor([int(whole.req_rows[0]), table.shape[0] - 1], dtype=torch.int32)
    chunk = extend_attention_triton(q, whole.k_cache, whole.v_cache, table, rows, torch.tensor([0, 5, 42], dtype=torch.int32),
                                    torch.tensor([20, 100], dtype=torch.int32), 16, 0.125, window, 37)
    assert torch.equal(chunk[5:], out[63:])


@needs_triton
def test_triton_decode_batch_invariant() -> None:
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    # Alone or in a batch, with the grid sized by the page table or by max_seq_len.
    b = paged_batch([1300, 20, 700], [1, 1, 1], 4, 1, 64, 16, torch.bfloat16, seed=10)
    run = lambda sl, max_len=None: decode_attention_triton(  # noqa: E731
        b.q[sl], b.k_cache, b.v_cache, b.page_table, b.req_rows[sl], b.seq_lens[sl], 16, 0.125, None,
        torch.empty_like(b.q[sl]), max_len)
    batched = run(slice(0, 3))
    assert torch.equal(run(slice(0, 1))[0], batched[0])
    assert torch.equal(run(slice(0, 3), 1300), batched)


DTYPE_CASES = [  # Hq, Hkv, D, page_size, window, dtype, fp8 cache
    (8, 2, 64, 16, None, torch.bfloat16, False),
    (4, 1, 128, 4, None, torch.bfloat16, True),
    (6, 3, 128, 1, 100, torch.float32, False),
    (2, 2, 64, 16, 40, torch.float16, False),
]


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "d", "page_size", "window", "dtype", "fp8"), DTYPE_CASES)
def test_triton_decode_dtypes_and_split_edges(
    hq: int, hkv: int, d: int, page_size: int, window: int | None, dtype: torch.dtype, fp8: bool,
) -> None:
    # fp16 and fp8 caches too, at lengths on and around a split's edge (splits of one
    # 64-key block here: 64 fills one exactly, 513 is one key past eight).
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton
    from edgemoe.quant.kv import dequantise_kv, quantise_kv

    b = paged_batch([1, 7, 300, 600, 65], [1] * 5, hq, hkv, d, page_size, dtype, seed=d + hq + 2)
    k, v, ks, vs = b.k_cache, b.v_cache, None, None
    if fp8:
        (k, ks), (v, vs) = quantise_kv(b.k_cache), quantise_kv(b.v_cache)
    kd, vd = (dequantise_kv(k, ks, torch.float32), dequantise_kv(v, vs, torch.float32)) if fp8 else (k, v)
    for lens in (b.seq_lens, torch.tensor([1, 1, 299, 513, 64], dtype=torch.int32)):
        args = (b.q, k, v, b.page_table, b.req_rows, lens, page_size, d**-0.5, window)
        got = decode_attention_triton(*args, torch.full_like(b.q, float("nan")), None, ks, vs)  # poisoned output
        want = decode_attention_ref(b.q.float(), kd.float(), vd.float(), b.page_table, b.req_rows, lens, page_size,
                                    d**-0.5, window, torch.empty(b.q.shape))
        assert_attention_close(got, want, vd)


@needs_triton
@pytest.mark.parametrize(("kernel", "d", "window"), [("decode", 576, None), ("decode", 520, 100), ("extend", 520, None)])
def test_triton_wide_shared_rows(kernel: str, d: int, window: int | None) -> None:
    """MLA's latent cache: one kv head whose row pads past 512 dims (the wide-row tiles:
    `attn_decode_tiles.WIDE_HEAD`, `attn_extend.extend_config`), 5 query heads over it, and
    the value the key's own tensor (`KVPool(shared_kv=True)`): decode takes the split of
    `attn_decode_shared` (the row as 512 + the rest), with a window too."""
    import dataclasses

    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton
    from edgemoe.kernels.triton_ops.attn_decode_shared import takes_shared_split
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    decode = kernel == "decode"
    b = paged_batch([300, 17, 1], [1, 1, 1] if decode else [40, 17, 1], 5, 1, d, 16, torch.bfloat16, seed=d)
    b = dataclasses.replace(b, v_cache=b.k_cache)
    assert takes_shared_split(b.k_cache, b.k_cache, None)
    assert not takes_shared_split(b.k_cache, b.k_cache.clone(), None)
    if decode:
        out = torch.full_like(b.q, float("nan"))
        decode_attention_triton(b.q, b.k_cache, b.k_cache, b.page_table, b.req_rows, b.seq_lens, 16, d**-0.5,
                                window, out)
    else:
        out = extend_attention_triton(b.q, b.k_cache, b.k_cache, b.page_table, b.req_rows, b.cu_seqlens_q,
                                      b.seq_lens, 16, d**-0.5, window, b.max_q_len)
    assert_attention_close(out, fp32_reference(b, window, decode=decode), b.k_cache)


def test_the_shared_split_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    from edgemoe.kernels.triton_ops.attn_decode_shared import shared_parts, takes_shared_split

    row = torch.zeros(4, 1, 576)
    assert takes_shared_split(row, row, None) and shared_parts(576) == (512, 64)
    two_heads, pow2 = torch.zeros(4, 2, 576), torch.zeros(4, 1, 512)
    assert not takes_shared_split(two_heads, two_heads, None) and not takes_shared_split(pow2, pow2, None)
    assert not takes_shared_split(row, row.clone(), None) and not takes_shared_split(row, row, torch.ones(4, 1))
    monkeypatch.setenv("EDGEMOE_SHARED_SPLIT", "0")
    assert not takes_shared_split(row, row, None)
