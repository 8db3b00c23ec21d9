"""RoPE + KV-cache write: the reference against the existing rotary kernel and
transformers' partial rotary; the Triton kernel (interpreter on CPU) bitwise against it,
and with Qwen3's per-head q/k norms fused in, against the model's norms then the reference."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.attention import write_kv_ref
from edgemoe.kernels.rope_kv import apply_rope_partial_ref, rope_write_kv_ref
from edgemoe.kernels.rotary import apply_rope_ref, rope_cos_sin
from edgemoe.layers.norm import RMSNorm
from edgemoe.quant.kv import KV_FP8, dequantise_kv, quantise_kv
from edgemoe.testing.kernel_inputs import head_norm_rope_bound

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
T, P, SLOTS = 9, 64, 24
EPS = 1e-6


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
# the grid is (token, kv head), each program a kv head and ceil(HQ / HKV) q heads: 2 a
# group, 3 (padded to 4), 5 under one kv head, 1 a kv head, and 7 over 3 programs (3, 3, 1);
# groups too wide for one program's tile in chunks (`q_chunk`): MLA's 20 heads over one
# 576-wide row (5 chunks of 4), and groups of 5 over 640 dims (chunks of 4 and 1, two kv heads)
@pytest.mark.parametrize(("hq", "hkv", "d", "rotary_dim"),
                         [(4, 2, 64, 64), (6, 2, 32, 8), (5, 1, 64, 16), (4, 4, 32, 32), (7, 3, 48, 8),
                          (20, 1, 576, 64), (10, 2, 640, 32)])
def test_triton_rope_write_kv_bitwise(dtype: torch.dtype, hq: int, hkv: int, d: int, rotary_dim: int) -> None:
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    q, k, v, positions, out_loc = qkv(dtype, hq, hkv, d, seed=2)
    q[3, hq - 1], k[5, 0] = 0, 0  # zero heads: torch's rotation gives -0 where cos < 0 (x * -1, not 0 - x)
    _, cos, sin = tables(rotary_dim, scaling=1.1)
    want_caches = [torch.full((SLOTS, hkv, d), 7.0, dtype=dtype) for _ in range(2)]  # 7: never written
    got_caches = [c.clone() for c in want_caches]
    want_q = rope_write_kv_ref(q, k, v, positions, cos, sin, *want_caches, out_loc)
    got_q = rope_write_kv_triton(q, k, v, positions, cos, sin, *got_caches, out_loc)
    # Same roundings at the same points (each product, then the sum): bitwise equal, the
    # sign of zero included (torch.equal takes -0 == 0: compare the bits).
    for got, want in ((got_q, want_q), *zip(got_caches, want_caches, strict=True)):
        assert torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("path", ["ref", pytest.param("triton", marks=needs_triton)])
# 5 heads over one row of 24 (8 rotating); MLA's shape, 20 heads over 576 (64 rotating), in chunks
@pytest.mark.parametrize(("hq", "d", "rotary_dim"), [(5, 24, 8), (20, 576, 64)])
def test_a_shared_value_is_the_key_written_once_rotated(path: str, fp8: bool, hq: int, d: int, rotary_dim: int) -> None:
    """`v` None (MLA's latent row: the pool's V is K's tensor): rotated k lands in the cache,
    as the write of k alone would put it; the value is never written over it unrotated."""
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    write = rope_write_kv_ref if path == "ref" else rope_write_kv_triton
    q, k, _, positions, out_loc = qkv(torch.bfloat16, hq, 1, d, seed=4)
    _, cos, sin = tables(rotary_dim)
    cache = torch.full((SLOTS, 1, d), 7.0, dtype=torch.bfloat16)
    scale = torch.ones(SLOTS, 1) if fp8 else None
    if fp8:
        cache = cache.to(KV_FP8)
    got_q = write(q, k, None, positions, cos, sin, cache, cache, out_loc, scale, scale)
    want = torch.full_like(cache, 7.0) if not fp8 else torch.full((SLOTS, 1, d), 7.0, dtype=torch.bfloat16).to(KV_FP8)
    want_scale = torch.ones(SLOTS, 1) if fp8 else None
    want_q = rope_write_kv_ref(q, k, k, positions, cos, sin, want, torch.empty_like(want), out_loc, want_scale,
                               torch.ones(SLOTS, 1) if fp8 else None)
    assert torch.equal(bits(got_q), bits(want_q)) and torch.equal(bits(cache), bits(want))
    if fp8:
        assert torch.equal(scale, want_scale)
    rotated = apply_rope_partial_ref(k, positions, cos, sin)
    assert not torch.equal(rotated, k)  # the check can tell rotated from not


def bits(x: torch.Tensor) -> torch.Tensor:
    """x's bit patterns (as integers of its width): equal exactly when x is bitwise equal."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])


def head_norm_weights(d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(d, generator=g) * 0.3 + 1).to(dtype) for _ in range(2))  # type: ignore[return-value]


def unfused(q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own per-head norms (layers/norm.py), as the unfused path applies them."""
    return RMSNorm(qw, EPS)(q), RMSNorm(kw, EPS)(k)


def assert_within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
    diff = (got.float() - want.float()).abs()
    assert (diff <= bound).all(), (diff - bound).max()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# odd head counts, partial rotary, a head dim that is not a power of two (padded lanes
# must not count in the mean of squares), 7 q heads over 3 programs (3, 3, 1), groups of 5
# over 640 dims in chunks of 4 and 1
@pytest.mark.parametrize(("hq", "hkv", "d", "rotary_dim"),
                         [(4, 2, 64, 64), (5, 1, 64, 16), (3, 3, 48, 8), (7, 3, 32, 16), (10, 2, 640, 32)])
def test_triton_head_norms_match_norm_then_rope(dtype: torch.dtype, hq: int, hkv: int, d: int, rotary_dim: int) -> None:
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    q, k, v, positions, out_loc = qkv(dtype, hq, hkv, d, seed=3)
    q, k = q * 3 + 0.5, k * 2 - 0.25  # off unit scale and centre: the norm must do something
    qw, kw = head_norm_weights(d, dtype, seed=4)
    _, cos, sin = tables(rotary_dim, scaling=1.1)
    want_caches = [torch.full((SLOTS, hkv, d), 7.0, dtype=dtype) for _ in range(2)]  # 7: never written
    got_caches = [c.clone() for c in want_caches]
    qn, kn = unfused(q, k, qw, kw)
    want_q = rope_write_kv_ref(qn, kn, v, positions, cos, sin, *want_caches, out_loc)
    ref_caches = [c.clone() for c in want_caches]
    assert torch.equal(rope_write_kv_ref(q, k, v, positions, cos, sin, *ref_caches, out_loc, None, None, qw, kw, EPS),
                       want_q)  # the reference with norms is exactly the unfused computation
    got_q = rope_write_kv_triton(q, k, v, positions, cos, sin, *got_caches, out_loc, None, None, qw, kw, EPS)
    # The kernel's fp32 sums of squares run in another order: the normalised heads may part
    # by a rounding of the dtype, then rotate (head_norm_rope_bound).
    assert_within(got_q, want_q, head_norm_rope_bound(qn, positions, cos, sin))
    assert_within(got_caches[0][out_loc], want_caches[0][out_loc], head_norm_rope_bound(kn, positions, cos, sin))
    assert torch.equal(got_caches[1], want_caches[1])  # v: copied, not normalised
    unwritten = torch.ones(SLOTS, dtype=torch.bool)
    unwritten[out_loc] = False
    assert (got_caches[0][unwritten] == 7.0).all()


@needs_triton
def test_triton_head_norms_with_an_fp8_cache() -> None:
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    hq, hkv, d, rotary_dim = 5, 1, 64, 32
    q, k, v, positions, out_loc = qkv(torch.bfloat16, hq, hkv, d, seed=5)
    qw, kw = head_norm_weights(d, torch.bfloat16, seed=6)
    _, cos, sin = tables(rotary_dim)

    def fp8() -> list[torch.Tensor]:
        return [torch.zeros(SLOTS, hkv, d, dtype=KV_FP8), torch.zeros(SLOTS, hkv, d, dtype=KV_FP8),
                torch.ones(SLOTS, hkv), torch.ones(SLOTS, hkv)]

    got, want = fp8(), fp8()
    norms = (qw, kw, EPS)
    got_q = rope_write_kv_triton(q, k, v, positions, cos, sin, got[0], got[1], out_loc, got[2], got[3], *norms)
    qn, kn = unfused(q, k, qw, kw)
    want_q = rope_write_kv_ref(qn, kn, v, positions, cos, sin, want[0], want[1], out_loc, want[2], want[3])
    assert_within(got_q, want_q, head_norm_rope_bound(qn, positions, cos, sin))
    assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8)) and torch.equal(got[3], want[3])  # v
    # k: the kernel quantises its own normalised, rotated k as quantise_kv does (bitwise:
    # the same kernel with a bf16 cache gives that k) ...
    plain = [torch.zeros(SLOTS, hkv, d, dtype=torch.bfloat16) for _ in range(2)]
    assert torch.equal(rope_write_kv_triton(q, k, v, positions, cos, sin, *plain, out_loc, None, None, *norms), got_q)
    k_codes, k_scales = quantise_kv(plain[0][out_loc])
    assert torch.equal(got[0][out_loc].view(torch.uint8), k_codes.view(torch.uint8))
    assert torch.equal(got[2][out_loc], k_scales)
    # ... and dequantised it is the reference's within the bf16 bound plus each side's e4m3
    # rounding: 2^-4 relative (3 mantissa bits), 2^-10 x scale below 2^-6 (subnormals).
    k_rot = apply_rope_partial_ref(kn, positions, cos, sin).float()
    bound = head_norm_rope_bound(kn, positions, cos, sin)
    scales = (got[2][out_loc] + want[2][out_loc])[..., None]
    e4m3 = 2**-4 * (1 + 2**-20) * (2 * k_rot.abs() + bound) + 2**-10 * scales
    deq = [dequantise_kv(c[0][out_loc], c[2][out_loc], torch.float32) for c in (got, want)]
    assert_within(deq[0], deq[1], bound + e4m3)


def test_head_norm_weights_come_together() -> None:
    q, k, v, positions, out_loc = qkv(torch.float32, 2, 1, 16)
    _, cos, sin = tables(16)
    caches = [torch.zeros(SLOTS, 1, 16) for _ in range(2)]
    with pytest.raises(ValueError, match="together"):
        rope_write_kv_ref(q, k, v, positions, cos, sin, *caches, out_loc, q_norm_w=torch.ones(16))
    with pytest.raises(ValueError, match=r"\[16\]"):
        rope_write_kv_ref(q, k, v, positions, cos, sin, *caches, out_loc, q_norm_w=torch.ones(8), k_norm_w=torch.ones(8))


def fp8_caches(hkv: int, d: int) -> list[torch.Tensor]:
    """e4m3 k/v caches and their scales, every entry set to a value no write produces here."""
    return [torch.full((SLOTS, hkv, d), 7.0).to(KV_FP8), torch.full((SLOTS, hkv, d), 7.0).to(KV_FP8),
            torch.full((SLOTS, hkv), 3.0), torch.full((SLOTS, hkv), 3.0)]


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "d", "rotary_dim"), [(4, 4, 32, 32), (6, 2, 32, 16), (7, 3, 48, 8)])
def test_triton_fp8_cache_each_kv_head_by_its_program(hq: int, hkv: int, d: int, rotary_dim: int) -> None:
    """An fp8 cache: each (token, kv head) program writes its head's e4m3 k and v and their
    scales, bitwise as the reference quantises them (quantise_kv), and nothing else."""
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    q, k, v, positions, out_loc = qkv(torch.bfloat16, hq, hkv, d, seed=7)
    k[4, hkv - 1] = 0  # a zero head: scale 1, and -0 codes where cos < 0
    _, cos, sin = tables(rotary_dim)
    got, want = fp8_caches(hkv, d), fp8_caches(hkv, d)
    got_q = rope_write_kv_triton(q, k, v, positions, cos, sin, got[0], got[1], out_loc, got[2], got[3])
    want_q = rope_write_kv_ref(q, k, v, positions, cos, sin, want[0], want[1], out_loc, want[2], want[3])
    assert torch.equal(bits(got_q), bits(want_q))
    for a, b in zip(got, want, strict=True):  # whole caches (unwritten rows kept), the sign of zero included
        assert torch.equal(bits(a), bits(b))


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "d", "rotary_dim", "fp8"),
                         [(6, 2, 32, 16, True), (7, 3, 48, 8, False), (10, 2, 640, 32, True)])
def test_triton_rows_do_not_depend_on_the_batch(hq: int, hkv: int, d: int, rotary_dim: int, fp8: bool) -> None:
    """Batch invariance (the launch depends on the heads only): with head norms (the path
    with a reduction), token 4 alone (T = 1) and tokens 2-4 (T = 3) give bitwise the rows
    the whole batch (T = 9) gives them."""
    from edgemoe.kernels.triton_ops.rope import rope_write_kv_triton

    q, k, v, positions, out_loc = qkv(torch.bfloat16, hq, hkv, d, seed=8)
    qw, kw = head_norm_weights(d, torch.bfloat16, seed=9)
    _, cos, sin = tables(rotary_dim, scaling=1.1)

    def run(rows: slice) -> tuple[torch.Tensor, list[torch.Tensor]]:
        caches = fp8_caches(hkv, d) if fp8 else [torch.zeros(SLOTS, hkv, d, dtype=torch.bfloat16) for _ in range(2)]
        scales = caches[2:] if fp8 else [None, None]
        out = rope_write_kv_triton(q[rows], k[rows], v[rows], positions[rows], cos, sin, caches[0], caches[1],
                                   out_loc[rows], *scales, qw, kw, EPS)
        return out, caches

    all_q, all_caches = run(slice(0, T))
    for rows in (slice(4, 5), slice(2, 5)):
        part_q, part_caches = run(rows)
        assert torch.equal(bits(part_q), bits(all_q[rows]))
        for a, b in zip(part_caches, all_caches, strict=True):
            assert torch.equal(bits(a[out_loc[rows]]), bits(b[out_loc[rows]]))
