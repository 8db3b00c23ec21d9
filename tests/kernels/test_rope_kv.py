"""RoPE + KV-cache write: the reference against the existing rotary kernel and
transformers' partial rotary; the Triton kernel (interpreter on CPU) bitwise against it."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.attention import write_kv_ref
from edgemoe.kernels.rope_kv import apply_rope_partial_ref, rope_write_kv_ref
from edgemoe.kernels.rotary import apply_rope_ref, rope_cos_sin

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
T, P, SLOTS = 9, 64, 24


def tables(rotary_dim: int, scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(P).float()[:, None] * inv_freq[None, :]  # [P, R/2]
    return inv_freq, freqs.cos() * scaling, freqs.sin() * scaling


def qkv(dtype: torch.dtype, hq: int, hkv: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, h, d, generator=g).to(dtype) for h in (hq, hkv, hkv))
    positions = torch.randint(0, P, (T,), generator=g)
    out_loc = torch.randperm(SLOTS, generator=g)[:T]
    return q, k, v, positions, out_loc


@pytest.mark.parametrize("dtype", DTYPES)
def test_ref_matches_existing_rope_and_write(dtype: torch.dtype) -> None:
    q, k, v, positions, out_loc = qkv(dtype, 4, 2, 16)
    inv_freq, cos, sin = tables(16, scaling=1.25)
    caches = [torch.zeros(SLOTS, 2, 16, dtype=dtype) for _ in range(4)]
    got_q = rope_write_kv_ref(q, k, v, positions, cos, sin, caches[0], caches[1], out_loc)
    cos_t, sin_t = rope_cos_sin(positions, inv_freq, 1.25, dtype)
    assert torch.equal(got_q, apply_rope_ref(q, cos_t, sin_t))
    write_kv_ref(caches[2], caches[3], apply_rope_ref(k, cos_t, sin_t), v, out_loc)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_ref_matches_transformers(dtype: torch.dtype) -> None:
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, _, positions, _ = qkv(dtype, 4, 2, 32, seed=1)
    _, cos, sin = tables(8)  # rotary_dim 8 of head_dim 32 (Qwen3.5 rotates 64 of 256)
    emb = lambda t: torch.cat((t, t), -1)[positions].to(dtype)[None]  # noqa: E731  # HF: [1, T, R] in the dtype
    want_q, want_k = mod.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb(cos), emb(sin))
    assert torch.equal(apply_rope_partial_ref(q, positions, cos, sin), want_q[0].transpose(0, 1))
    assert torch.equal(apply_rope_partial_ref(k, positions, cos, sin), want_k[0].transpose(0, 1))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d", "rotary_dim"), [(4, 2, 64, 64), (6, 2, 32, 8), (5, 1, 64, 16)])
def test_triton_rope_write_kv_bitwise(dtype: torch.dtype, hq: int, hkv: int, d: int, rotary_dim: int) -> None:
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    q, k, v, positions, out_loc = qkv(dtype, hq, hkv, d, seed=2)
    _, cos, sin = tables(rotary_dim, scaling=1.1)
    want_caches = [torch.full((SLOTS, hkv, d), 7.0, dtype=dtype) for _ in range(2)]  # 7: never written
    got_caches = [c.clone() for c in want_caches]
    want_q = rope_write_kv_ref(q, k, v, positions, cos, sin, *want_caches, out_loc)
    got_q = rope_write_kv_triton(q, k, v, positions, cos, sin, *got_caches, out_loc)
    # Same roundings at the same points (each product, then the sum): bitwise equal.
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_caches[0], want_caches[0]) and torch.equal(got_caches[1], want_caches[1])
