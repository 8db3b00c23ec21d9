"""The fp8 KV cache on the GPU: the compiled attention kernels read e4m3 + scales and match
attention over the dequantised cache (bf16 tolerance), at the Qwen3-30B-A3B head shape
(32 q / 4 kv heads x 128) and 8K context; fp8 against a bf16 cache within e4m3's rounding
of keys and values; the compiled rope+KV write quantises as the reference."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgemoe.kernels.paged_attention import (
    decode_attention,
    decode_attention_ref,
    extend_attention,
    extend_attention_ref,
)
from edgemoe.kernels.rope_kv import rope_write_kv, rope_write_kv_ref
from edgemoe.quant.kv import KV_FP8, dequantise_kv, quantise_kv
from edgemoe.testing.kernel_inputs import paged_batch, rope_bound

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_decode_and_extend_read_fp8() -> None:
    d = paged_batch([8192, 1000, 1], [1, 1, 1], 32, 4, 128, 16, torch.bfloat16, device="cuda", seed=1)
    (kq, ks), (vq, vs) = quantise_kv(d.k_cache), quantise_kv(d.v_cache)
    kd, vd = dequantise_kv(kq, ks, torch.bfloat16), dequantise_kv(vq, vs, torch.bfloat16)
    args = (d.page_table, d.req_rows, d.seq_lens, 16, 128**-0.5, None)
    want = decode_attention_ref(d.q, kd, vd, *args, torch.empty_like(d.q))
    got = decode_attention(d.q, kq, vq, *args, torch.empty_like(d.q), None, ks, vs)
    # bf16 probabilities (value scales folded in) and output: 2^-7 of max|v| (test_paged_attention's bound).
    assert (got.float() - want.float()).abs().max() <= 2**-7 * vd.float().abs().max()
    e = paged_batch([3000, 700], [1000, 700], 32, 4, 128, 16, torch.bfloat16, device="cuda", seed=2)
    (kq, ks), (vq, vs) = quantise_kv(e.k_cache), quantise_kv(e.v_cache)
    kd, vd = dequantise_kv(kq, ks, torch.bfloat16), dequantise_kv(vq, vs, torch.bfloat16)
    args = (e.page_table, e.req_rows, e.cu_seqlens_q, e.seq_lens, 16, 128**-0.5, None, e.max_q_len)
    want = extend_attention_ref(e.q, kd, vd, *args)
    got = extend_attention(e.q, kq, vq, *args, ks, vs)
    assert (got.float() - want.float()).abs().max() <= 2**-7 * vd.float().abs().max()
    # Against the bf16 cache: keys off by <= 2^-4 relative move each score by <= 2^-4·Σ|q||k|·scale,
    # so each weight by a factor within exp(±2·that); values off by <= 2^-4 |v| (+ 2^-10 of the scale).
    bf16 = extend_attention(e.q, e.k_cache, e.v_cache, *args)
    score_err = 2**-4 * (e.q.float().abs().amax() * e.k_cache.float().abs().amax() * 128 * 128**-0.5)
    vmax = e.v_cache.float().abs().max()
    bound = vmax * (torch.exp(2 * score_err) - 1 + 2**-4 + 2**-10) + 2**-7 * vmax
    assert (got.float() - bf16.float()).abs().max() <= bound


def test_rope_write_fp8_matches_reference() -> None:
    g = torch.Generator(device="cuda").manual_seed(3)
    T, Hq, Hkv, D, S = 64, 32, 4, 128, 256
    q, k, v = (torch.randn(T, h, D, generator=g, device="cuda").bfloat16() for h in (Hq, Hkv, Hkv))
    cos, sin = torch.rand(4096, D // 2, generator=g, device="cuda"), torch.rand(4096, D // 2, generator=g, device="cuda")
    pos = torch.randint(0, 4096, (T,), generator=g, device="cuda")
    loc = torch.randperm(S, generator=g, device="cuda")[:T]
    out = []
    for fn in (rope_write_kv_ref, rope_write_kv):
        kc, vc = torch.zeros(S, Hkv, D, dtype=KV_FP8, device="cuda"), torch.zeros(S, Hkv, D, dtype=KV_FP8, device="cuda")
        ksc, vsc = torch.ones(S, Hkv, device="cuda"), torch.ones(S, Hkv, device="cuda")
        out.append((fn(q, k, v, pos, cos, sin, kc, vc, loc, ksc, vsc), kc.view(torch.uint8), vc.view(torch.uint8), ksc, vsc))
    (q_ref, kc_ref, vc_ref, ks_ref, vs_ref), (q_got, kc_got, vc_got, ks_got, vs_got) = out
    assert torch.equal(vc_got, vc_ref) and torch.equal(vs_got, vs_ref)  # v is not rotated: the same codes
    # q and the rotated k may differ by the rotary's bf16 roundings (a compiler may keep a
    # product in fp32: rope_bound); k's e4m3 codes and scales then by one e4m3 rounding
    # each side (2^-4 of the per-(token, head) amax).
    assert ((q_got.float() - q_ref.float()).abs() <= rope_bound(q, pos, cos, sin)).all()
    deq = lambda c, sc: c.view(KV_FP8).float()[loc] * sc[loc][:, :, None]  # noqa: E731
    amax = deq(kc_ref, ks_ref).abs().amax(-1, keepdim=True)
    bound = rope_bound(k, pos, cos, sin) + 2 * 2**-4 * amax
    assert ((deq(kc_got, ks_got) - deq(kc_ref, ks_ref)).abs() <= bound).all()
