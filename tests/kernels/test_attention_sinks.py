"""Attention sinks (gpt-oss) in every attention path: the torch kernels (ref, sdpa), the
Triton decode (split-K: the sink enters in the merge) and extend kernels (interpreter on
CPU), and both backends through `AttentionSpec.sinks`, against a plain float64 reference
written here: transformers' `eager_attention_forward` (the sink column concatenated to
each row's scores, softmax, the column dropped), keys gathered page by page by hand."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

import pytest
import torch
from tolerances import eps

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels.attention import paged_attention_ref, paged_attention_sdpa
from edgemoe.layers.attention_backend import AttentionSpec
from edgemoe.layers.batch import BatchHost, BatchMode, ForwardBatch
from edgemoe.quant.kv import dequantise_kv, quantise_kv
from edgemoe.testing.kernel_inputs import PagedBatch, paged_batch

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

# 8 splits of 16-key blocks, merging 4 a step (attn_decode_tiles' override): splits of
# several blocks, several merge steps, dead splits before a window, at lengths the
# interpreter runs fast. The default tiles (64 splits of 64 keys) get a case of their own.
SMALL_TILES = "8,16,4,2,4"
U32 = eps(torch.float32) / 2


def sink_batch(seq_lens: list[int], q_lens: list[int], hq: int, hkv: int, d: int, page_size: int,
               dtype: torch.dtype, seed: int) -> tuple[PagedBatch, torch.Tensor]:
    """A paged batch whose sinks matter: small logits (q / 4: exp(z) near 1 a key), values
    1 + N(0, 1/16) (a row's output near 1, not averaged away), sinks around log 64 so a
    sink holds a large share of a row (and none of its value): a missing or doubled sink
    moves the output far beyond any rounding bound below."""
    b = paged_batch(seq_lens, q_lens, hq, hkv, d, page_size, dtype, seed=seed)
    b = dataclasses.replace(b, q=(b.q.float() / 4).to(dtype), v_cache=(b.v_cache.float() / 4 + 1).to(dtype))
    g = torch.Generator().manual_seed(seed + 1)
    return b, math.log(64) + 1.5 * torch.randn(hq, generator=g)


def slots_by_hand(b: PagedBatch, seq: int) -> list[int]:
    row, ctx = int(b.req_rows[seq]), int(b.seq_lens[seq])
    return [int(b.page_table[row, p // b.page_size]) * b.page_size + p % b.page_size for p in range(ctx)]


def reference(b: PagedBatch, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None,
              window: int | None) -> torch.Tensor:
    """[T, Hq, D] float64: each query row over its visible keys, transformers' formula."""
    hq, d = b.q.shape[1:]
    groups = hq // k_cache.shape[1]
    out = torch.zeros(b.q.shape, dtype=torch.float64)
    cu = b.cu_seqlens_q.tolist()
    for seq in range(len(cu) - 1):
        slots, ctx = slots_by_hand(b, seq), int(b.seq_lens[seq])
        k = k_cache[slots].double().repeat_interleave(groups, dim=1)  # [C, Hq, D]
        v = v_cache[slots].double().repeat_interleave(groups, dim=1)
        for t in range(cu[seq], cu[seq + 1]):
            pos = ctx - (cu[seq + 1] - t)
            lo = 0 if window is None else max(0, pos - window + 1)
            scores = torch.einsum("hd,nhd->hn", b.q[t].double(), k[lo : pos + 1]) * d**-0.5  # [Hq, n]
            if sinks is not None:
                scores = torch.cat([scores, sinks.double()[:, None]], dim=1)
            probs = torch.softmax(scores, dim=1)[:, : pos + 1 - lo]  # the sink column dropped
            out[t] = torch.einsum("hn,nhd->hd", probs, v[lo : pos + 1])
    return out


def error_bound(dtype: torch.dtype, b: PagedBatch, k_cache: torch.Tensor, v_cache: torch.Tensor,
                sinks: torch.Tensor, logit_roundings: int, sink_roundings: int) -> float:
    """How far a path may be from the float64 reference on the same inputs (worst case,
    u = eps / 2 a rounding; γ_n = n·u / (1 - n·u)):
    - a logit: an fp32 dot product of D terms and its scaling (γ_{D+2} of z_max, the largest
      Σ|q_i k_i|·scale), `logit_roundings` roundings to `dtype` where a path rounds scores,
      `sink_roundings` of |s| where it rounds the sink; the split merge's LSEs (m + log2 l,
      two fp32 roundings of <= z_max + log2(C + 1)). Logits off by <= δ move each
      probability by a factor e^{±2δ} (its exp and the normaliser): e^{2δ} - 1 of weight;
    - the normaliser's and P·V's fp32 sums of <= C + 1 terms: γ_{C+2} each;
    - the probabilities rounded to `dtype` before P·V and the output: u each."""
    u = eps(dtype) / 2
    d, ctx = b.q.shape[-1], int(b.seq_lens.max())
    z_max = (b.q.float().abs().flatten(0, 1) @ k_cache.float().abs().flatten(0, 1).T).max().item() * d**-0.5
    s_max = sinks.abs().max().item()
    gamma = lambda n: n * U32 / (1 - n * U32)  # noqa: E731
    delta = (gamma(d + 2) + logit_roundings * u) * z_max + (gamma(2) + sink_roundings * u) * s_max
    delta += 4 * U32 * (z_max + math.log2(ctx + 1))
    return v_cache.float().abs().max().item() * (math.expm1(2 * delta) + 2 * gamma(ctx + 2) + 2 * u)


def assert_sinks_close(got: torch.Tensor, want: torch.Tensor, without_sinks: torch.Tensor, bound: float,
                       discriminating: bool = True) -> None:
    """Within the bound of the reference with sinks; and (where the bound is tight enough
    to tell) farther than 4 bounds from it without sinks, so a dropped sink would fail."""
    assert not got.isnan().any()
    err = (got.double() - want).abs().max().item()
    assert err <= bound, f"{err} > {bound}"
    if discriminating:
        assert (want - without_sinks).abs().max().item() > 4 * bound


# Torch kernels: dtype, logit roundings (bf16 ref: the score matmul's output and its scaling;
# sdpa's math backend: q and k scaled by sqrt(scale), the product), sink roundings (sdpa: the
# sink coordinate's cast, the two sqrt(scale) scalings, the product; the ref keeps it fp32).
TORCH_KERNELS = [
    (paged_attention_ref, torch.float32, 0, 0),
    (paged_attention_ref, torch.bfloat16, 2, 0),
    (paged_attention_sdpa, torch.float32, 3, 4),
    (paged_attention_sdpa, torch.bfloat16, 3, 4),
]
TORCH_CASES = [  # Hq, Hkv, page_size, window
    (4, 4, 1, None),
    (6, 2, 16, 5),
]


@pytest.mark.parametrize(("kernel", "dtype", "logit_roundings", "sink_roundings"), TORCH_KERNELS)
@pytest.mark.parametrize(("hq", "hkv", "page_size", "window"), TORCH_CASES)
def test_torch_kernels(kernel, dtype: torch.dtype, logit_roundings: int, sink_roundings: int,  # noqa: ANN001
                       hq: int, hkv: int, page_size: int, window: int | None) -> None:
    # A chunk after a cached prefix, a whole prompt, a lone decode token.
    b, sinks = sink_batch([40, 23, 30], [9, 23, 1], hq, hkv, 32, page_size, dtype, seed=hq + page_size)
    cu = b.cu_seqlens_q.tolist()
    got = torch.empty_like(b.q)
    for seq in range(3):
        slots = torch.tensor(slots_by_hand(b, seq))
        got[cu[seq] : cu[seq + 1]] = kernel(b.q, b.k_cache, b.v_cache, cu[seq], cu[seq + 1] - cu[seq], slots,
                                            32**-0.5, window, None, None, sinks)
    bound = error_bound(dtype, b, b.k_cache, b.v_cache, sinks, logit_roundings, sink_roundings)
    # sdpa in bf16: the sink rounded to bf16 (4 roundings of |s| ~ 6) leaves a bound too
    # loose to tell a dropped sink; its fp32 run and the ref's bf16 run tell.
    assert_sinks_close(got, reference(b, b.k_cache, b.v_cache, sinks, window),
                       reference(b, b.k_cache, b.v_cache, None, window), bound,
                       discriminating=not (kernel is paged_attention_sdpa and dtype == torch.bfloat16))


def test_spec_leaves_sinks_out_of_eq_and_hash() -> None:
    spec = lambda s: AttentionSpec(0, 4, 2, 64, 0.125, window=128, sinks=s)  # noqa: E731
    assert spec(torch.zeros(4)) == spec(torch.ones(4)) and hash(spec(torch.zeros(4))) == hash(spec(None))


DECODE_CASES = [  # Hq, Hkv, page_size, window, dtype, fp8 cache, tiles (None: the defaults)
    (4, 2, 16, None, torch.float32, False, SMALL_TILES),
    (4, 2, 1, 70, torch.float32, False, SMALL_TILES),
    (2, 2, 16, 40, torch.bfloat16, False, SMALL_TILES),
    (4, 1, 16, None, torch.bfloat16, True, SMALL_TILES),
    (4, 2, 16, 100, torch.bfloat16, False, None),
]


def fp8_caches(b: PagedBatch, fp8: bool) -> tuple[torch.Tensor, ...]:
    """(k, v, k scales, v scales, k and v as the kernel reads them: dequantised, fp32)."""
    if not fp8:
        return b.k_cache, b.v_cache, None, None, b.k_cache, b.v_cache
    (k, ks), (v, vs) = quantise_kv(b.k_cache), quantise_kv(b.v_cache)
    return k, v, ks, vs, dequantise_kv(k, ks, torch.float32), dequantise_kv(v, vs, torch.float32)


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "page_size", "window", "dtype", "fp8", "tiles"), DECODE_CASES)
def test_triton_decode(hq: int, hkv: int, page_size: int, window: int | None, dtype: torch.dtype, fp8: bool,
                       tiles: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton

    if tiles is not None:
        monkeypatch.setenv("EDGEMOE_ATTN_DECODE_TILES", tiles)
    # Small tiles: 256 fills all 8 splits of 32, 65 is one key past 4 splits of 16, 16 fills
    # one split, 1 a lone token. Default tiles: 65 is one key past a 64-key split, 64 fills one.
    lens = [256, 65, 16, 1] if tiles else [65, 64, 1]
    b, sinks = sink_batch(lens, [1] * len(lens), hq, hkv, 64, page_size, dtype, seed=hq + hkv + page_size)
    k, v, ks, vs, kd, vd = fp8_caches(b, fp8)
    out = torch.full_like(b.q, float("nan"))  # poisoned: every row must be written
    decode_attention_triton(b.q, k, v, b.page_table, b.req_rows, b.seq_lens, page_size, 64**-0.5, window, out,
                            None, ks, vs, sinks)
    assert_sinks_close(out, reference(b, kd, vd, sinks, window), reference(b, kd, vd, None, window),
                       error_bound(dtype, b, kd, vd, sinks, 0, 0))


EXTEND_CASES = [  # Hq, Hkv, page_size, window, dtype, fp8 cache
    (4, 2, 16, None, torch.float32, False),
    (2, 2, 1, 30, torch.bfloat16, False),
    (4, 1, 16, 50, torch.bfloat16, True),
]


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "page_size", "window", "dtype", "fp8"), EXTEND_CASES)
def test_triton_extend(hq: int, hkv: int, page_size: int, window: int | None, dtype: torch.dtype,
                       fp8: bool) -> None:
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    # A chunk after a cached prefix (two query blocks of 64), a whole prompt, a single token.
    b, sinks = sink_batch([100, 40, 9], [70, 40, 1], hq, hkv, 64, page_size, dtype, seed=hq + page_size)
    k, v, ks, vs, kd, vd = fp8_caches(b, fp8)
    out = extend_attention_triton(b.q, k, v, b.page_table, b.req_rows, b.cu_seqlens_q, b.seq_lens, page_size,
                                  64**-0.5, window, b.max_q_len, ks, vs, sinks)
    assert_sinks_close(out, reference(b, kd, vd, sinks, window), reference(b, kd, vd, None, window),
                       error_bound(dtype, b, kd, vd, sinks, 0, 0))


@needs_triton
def test_no_sinks_is_bitwise_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    # sinks=None is the call without the argument; sinks of -inf take the sink code path
    # (HAS_SINKS) and must give the same bits too: the first visible block (extend) or
    # live split (merge) rescales the sink's running sum of 1 by exp2(-inf) = 0.
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    monkeypatch.setenv("EDGEMOE_ATTN_DECODE_TILES", SMALL_TILES)
    minus_inf = torch.full((4,), float("-inf"))
    d, _ = sink_batch([200, 1], [1, 1], 4, 2, 64, 16, torch.bfloat16, seed=5)
    decode = lambda *sinks: decode_attention_triton(  # noqa: E731
        d.q, d.k_cache, d.v_cache, d.page_table, d.req_rows, d.seq_lens, 16, 0.125, 70, torch.empty_like(d.q),
        None, None, None, *sinks)
    base = decode()
    assert torch.equal(decode(None), base) and torch.equal(decode(minus_inf), base)
    e, _ = sink_batch([90, 9], [70, 9], 4, 2, 64, 16, torch.bfloat16, seed=6)
    extend = lambda *sinks: extend_attention_triton(  # noqa: E731
        e.q, e.k_cache, e.v_cache, e.page_table, e.req_rows, e.cu_seqlens_q, e.seq_lens, 16, 0.125, 30,
        e.max_q_len, None, None, *sinks)
    base = extend()
    assert torch.equal(extend(None), base) and torch.equal(extend(minus_inf), base)
    ref_args = (e.q, e.k_cache, e.v_cache, 0, 70, torch.tensor(slots_by_hand(e, 0)), 0.125, 30, None, None)
    assert torch.equal(paged_attention_ref(*ref_args, None), paged_attention_ref(*ref_args))


def forward_batch(b: PagedBatch, mode: BatchMode) -> ForwardBatch:
    """The engine's batch over `b`'s page table (the cache is written by hand, not by the step)."""
    q_lens = (b.cu_seqlens_q[1:] - b.cu_seqlens_q[:-1]).tolist()
    host = BatchHost(tuple(q_lens), tuple(b.seq_lens.tolist()), tuple(b.req_rows.tolist()),
                     len(q_lens) if mode is BatchMode.DECODE else 0)
    T, none = b.q.shape[0], torch.empty(0, dtype=torch.long)
    return ForwardBatch(mode, torch.zeros(T, dtype=torch.long), none, none, b.req_rows, b.seq_lens, b.cu_seqlens_q,
                        none, torch.empty(0, dtype=torch.int32), b.page_table, b.page_size, host)


@needs_triton
@pytest.mark.parametrize("backend", ["torch-ref", "torch-sdpa", "triton"])
def test_backends_honour_spec_sinks(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # AttentionSpec.sinks reaches the kernels through `attend`, prefill and decode (the
    # Triton backend's kernels run interpreted: its dispatchers are told to use them).
    from edgemoe.kernels import paged_attention
    from edgemoe.layers.torch_attention import TorchPagedAttention
    from edgemoe.layers.triton_attention import TritonPagedAttention

    monkeypatch.setenv("EDGEMOE_ATTN_DECODE_TILES", SMALL_TILES)
    monkeypatch.setattr(paged_attention, "use_triton", lambda t: True)
    for mode, q_lens in ((BatchMode.PREFILL, [20, 33]), (BatchMode.DECODE, [1, 1])):
        b, sinks = sink_batch([50, 33], q_lens, 4, 2, 32, 4, torch.float32, seed=7)
        pool = KVPool(1, b.k_cache.shape[0] // 4, 4, 2, 32, torch.float32, torch.device("cpu"))
        pool.k[0, : b.k_cache.shape[0]], pool.v[0, : b.v_cache.shape[0]] = b.k_cache, b.v_cache
        if backend == "triton":
            attn = TritonPagedAttention(pool, torch.device("cpu"))
        else:
            attn = TorchPagedAttention(pool, torch.device("cpu"), kernel=backend.removeprefix("torch-"))
        batch = forward_batch(b, mode)
        attn.prepare(batch)
        got = attn.attend(AttentionSpec(0, 4, 2, 32, 32**-0.5, window=40, sinks=sinks), b.q, batch)
        bound = error_bound(torch.float32, b, b.k_cache, b.v_cache, sinks, 3, 4)  # sdpa's roundings: the most
        assert_sinks_close(got, reference(b, b.k_cache, b.v_cache, sinks, 40),
                           reference(b, b.k_cache, b.v_cache, None, 40), bound)
