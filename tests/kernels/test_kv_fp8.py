"""The fp8 KV cache: the quantiser's round trip and known values; the pool; the torch
references read the dequantised cache; the Triton attention kernels (interpreter on
CPU) read e4m3 + scales directly and match attention over the dequantised cache; the
fused rope+KV write quantises exactly as the reference."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels.attention import paged_attention_ref, write_kv_ref
from edgemoe.kernels.paged_attention import decode_attention_ref, extend_attention_ref
from edgemoe.kernels.rope_kv import rope_write_kv_ref
from edgemoe.quant.kv import KV_FP8, dequantise_kv, quantise_kv
from edgemoe.testing.kernel_inputs import PagedBatch, paged_batch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

if INTERPRET:
    import triton
    import triton.language as tl

    from edgemoe.kernels.triton_ops.common import e4m3_to_f32, f32_to_e4m3

    @triton.jit
    def _e4m3_roundtrip(b_ptr, x_ptr, f_ptr, e_ptr, N: tl.constexpr):
        """The integer (no e4m3 type) conversions, both ways."""
        i = tl.arange(0, N)
        tl.store(f_ptr + i, e4m3_to_f32(tl.load(b_ptr + i), False))
        tl.store(e_ptr + i, f32_to_e4m3(tl.load(x_ptr + i), False, True))


def test_quantise_kv_round_trip_and_known_values() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=g) * torch.logspace(-4, 2, 50)[:, None, None]
    x[7, 1] = 0.0
    q, s = quantise_kv(x)
    assert q.dtype == KV_FP8 and s.shape == (50, 3) and s[7, 1] == 1.0
    back = dequantise_kv(q, s, torch.float32)
    # e4m3: 3 mantissa bits (2^-4 relative) above 2^-6, spacing 2^-9 below (2^-10 absolute), in units of the scale.
    assert ((back - x).abs() <= 2**-4 * x.abs() + 2**-10 * s[..., None] + 1e-30).all()
    head = torch.tensor([[448.0, -1.5, 0.25, 2**-9]])  # largest |x| 448: scale 1, every value exact in e4m3
    q, s = quantise_kv(head)
    assert s.tolist() == [1.0] and torch.equal(dequantise_kv(q, s, torch.float32), head)


def test_pool_holds_e4m3_and_scales() -> None:
    fp8 = KVPool(2, 4, 16, 2, 64, torch.bfloat16, torch.device("cpu"), "fp8")
    bf16 = KVPool(2, 4, 16, 2, 64, torch.bfloat16, torch.device("cpu"))
    slots = (4 + 1) * 16  # the pages plus the scratch page padded batch entries write into
    assert fp8.k.dtype == KV_FP8 and fp8.k_scale.shape == (2, slots, 2) and bf16.scales(0) == (None, None)
    assert fp8.nbytes() == bf16.nbytes() // 2 + 2 * 2 * slots * 2 * 4  # half, plus an fp32 scale per (slot, head)


def fp8_batch(b: PagedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's caches quantised: (k e4m3, v e4m3, k scales, v scales)."""
    (kq, ks), (vq, vs) = quantise_kv(b.k_cache), quantise_kv(b.v_cache)
    return kq, vq, ks, vs


def test_references_read_the_dequantised_cache() -> None:
    b = paged_batch([9, 14], [3, 1], 4, 2, 16, 4, torch.float32, seed=1)
    kq, vq, ks, vs = fp8_batch(b)
    kd, vd = dequantise_kv(kq, ks, torch.float32), dequantise_kv(vq, vs, torch.float32)
    args = (b.page_table, b.req_rows, b.cu_seqlens_q, b.seq_lens, b.page_size, 0.25, None, b.max_q_len)
    assert torch.equal(extend_attention_ref(b.q, kq, vq, *args, ks, vs), extend_attention_ref(b.q, kd, vd, *args))
    # The write path quantises: writing the float k/v reproduces the cache's bytes and scales.
    k_cache, v_cache = torch.zeros_like(kq), torch.zeros_like(vq)
    k_scale, v_scale = torch.ones_like(ks), torch.ones_like(vs)
    slots = torch.arange(b.k_cache.shape[0])
    write_kv_ref(k_cache, v_cache, b.k_cache, b.v_cache, slots, k_scale, v_scale)
    assert torch.equal(k_cache.view(torch.uint8), kq.view(torch.uint8)) and torch.equal(v_scale, vs)
    ctx = torch.arange(5)
    assert torch.equal(paged_attention_ref(b.q, kq, vq, 0, 3, ctx, 0.25, None, ks, vs),
                       paged_attention_ref(b.q, kd, vd, 0, 3, ctx, 0.25))


def attention_close(got: torch.Tensor, want: torch.Tensor, v: torch.Tensor) -> None:
    """As test_paged_attention.assert_attention_close, against attention over the
    dequantised cache: fp32, sums in another order (~1e-6 relative); bf16, the kernel
    rounds probabilities (folded with the value scales) and the output, 2^-7 max|v|."""
    rel = {torch.float32: 2e-6, torch.bfloat16: 2**-7}[got.dtype]
    assert not got.isnan().any()
    assert (got.float() - want.float()).abs().max() <= rel * v.float().abs().max()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40])
def test_triton_attention_reads_fp8(dtype: torch.dtype, window: int | None) -> None:
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton
    from edgemoe.kernels.triton_ops.attn_extend import extend_attention_triton

    d = paged_batch([600, 30, 1], [1, 1, 1], 6, 2, 64, 16, torch.float32, seed=3)
    kq, vq, ks, vs = fp8_batch(d)
    q = d.q.to(dtype)
    want = decode_attention_ref(q.float(), dequantise_kv(kq, ks, torch.float32), dequantise_kv(vq, vs, torch.float32),
                                d.page_table, d.req_rows, d.seq_lens, 16, 0.125, window, torch.empty(d.q.shape))
    out = torch.full_like(q, float("nan"))
    decode_attention_triton(q, kq, vq, d.page_table, d.req_rows, d.seq_lens, 16, 0.125, window, out, None, ks, vs)
    attention_close(out, want, d.v_cache)
    e = paged_batch([90, 20], [50, 20], 4, 2, 64, 16, torch.float32, seed=4)
    kq, vq, ks, vs = fp8_batch(e)
    args = (e.page_table, e.req_rows, e.cu_seqlens_q, e.seq_lens, 16, 0.125, window, e.max_q_len)
    want = extend_attention_ref(e.q, dequantise_kv(kq, ks, torch.float32), dequantise_kv(vq, vs, torch.float32), *args)
    attention_close(extend_attention_triton(e.q.to(dtype), kq, vq, *args, ks, vs), want, e.v_cache)


@needs_triton
def test_triton_rope_write_quantises_as_reference() -> None:
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    g = torch.Generator().manual_seed(5)
    T, Hq, Hkv, D, S = 5, 4, 2, 32, 12
    q, k, v = (torch.randn(T, h, D, generator=g).bfloat16() for h in (Hq, Hkv, Hkv))
    k[2, 1] = 0  # a zero head: scale 1
    cos, sin = torch.rand(20, D // 2, generator=g), torch.rand(20, D // 2, generator=g)
    pos, loc = torch.tensor([3, 9, 0, 4, 19]), torch.tensor([7, 0, 11, 2, 5])
    caches = []
    for fn in (rope_write_kv_ref, rope_write_kv_triton):
        kc, vc = torch.zeros(S, Hkv, D, dtype=KV_FP8), torch.zeros(S, Hkv, D, dtype=KV_FP8)
        ksc, vsc = torch.ones(S, Hkv), torch.ones(S, Hkv)
        q_out = fn(q, k, v, pos, cos, sin, kc, vc, loc, ksc, vsc)
        caches.append((q_out, kc.view(torch.uint8), vc.view(torch.uint8), ksc, vsc))
    for a, b in zip(*caches, strict=True):
        assert torch.equal(a, b)


@needs_triton
def test_e4m3_integer_conversions_match_torch() -> None:
    # sm_80/86 have no e4m3 type: bytes are converted with integer arithmetic there. The
    # GPU machine (sm_90) never runs those paths, so they are checked here, exhaustively.
    import triton

    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)  # all but NaN
    x = torch.cat([codes.view(KV_FP8).float(), torch.randn(2048) * torch.logspace(-4, 2.6, 2048),
                   torch.tensor([-0.0, 447.9, -448.0, 2**-9 * 0.5, 2**-9 * 1.5, 2**-9 * 2.5])]).clamp(-448, 448)
    n = triton.next_power_of_2(x.numel())
    b = torch.zeros(n, dtype=torch.uint8)
    b[: codes.numel()] = codes
    xs = torch.zeros(n)
    xs[: x.numel()] = x
    f, e = torch.empty(n), torch.empty(n, dtype=torch.uint8)
    _e4m3_roundtrip[(1,)](b, xs, f, e, N=n)
    assert torch.equal(f[: codes.numel()], codes.view(KV_FP8).float())
    assert torch.equal(e[: x.numel()], x.to(KV_FP8).view(torch.uint8))  # torch: round to nearest even, -0 kept


@needs_triton
def test_fp8_paths_without_the_e4m3_type(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sm_80/86 code paths end to end: fp8 KV attention and the rope write, fp8 weights.
    from edgemoe.kernels.triton_ops import attn_decode, common, moe_gemv_q, rope
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    for module in (attn_decode, moe_gemv_q, rope):
        monkeypatch.setattr(module, "fp8_hardware", lambda t: False)
    assert common.fp8_hardware(torch.zeros(1))  # the interpreter itself has the type
    d = paged_batch([70, 9], [1, 1], 4, 2, 32, 16, torch.float32, seed=7)
    kq, vq, ks, vs = fp8_batch(d)
    want = decode_attention_ref(d.q, kq, vq, d.page_table, d.req_rows, d.seq_lens, 16, 0.2, None,
                                torch.empty_like(d.q), None, ks, vs)
    out = torch.empty_like(d.q)
    attn_decode.decode_attention_triton(d.q, kq, vq, d.page_table, d.req_rows, d.seq_lens, 16, 0.2, None, out, None, ks, vs)
    attention_close(out, want, d.v_cache)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(3, h, 32, generator=g).bfloat16() for h in (4, 2, 2))
    cos, sin = torch.rand(8, 16, generator=g), torch.rand(8, 16, generator=g)
    pos, loc = torch.tensor([1, 5, 7]), torch.tensor([4, 0, 2])
    got = []
    for fn in (rope_write_kv_ref, rope_write_kv_triton):
        kc, vc = torch.zeros(6, 2, 32, dtype=KV_FP8), torch.zeros(6, 2, 32, dtype=KV_FP8)
        ksc, vsc = torch.ones(6, 2), torch.ones(6, 2)
        fn(q, k, v, pos, cos, sin, kc, vc, loc, ksc, vsc)
        got.append((kc.view(torch.uint8), vc.view(torch.uint8), ksc, vsc))
    assert all(torch.equal(a, b) for a, b in zip(*got, strict=True))
