"""Dequantisation inside Triton kernels: one weight tile of a quantised expert bank → fp32.

`dequant(data, scale, zero, r, k, mask, n_half, stride_d, stride_s, FMT, GROUP, FP8HW)` reads
W[r, k] for broadcastable index tensors r (weight rows = output features) and k (inputs)
of one slot's bank, the layouts of `edgemoe.quant` (`FMT_CODES`):
- int8: q [rows, K] int8, scale [rows, 1] fp32 → q·s;
- fp8:  q [rows, K] e4m3 (passed as uint8: sm_80/86 have no e4m3 type), scale [row blocks, ceil(K/GROUP)] fp32, rows in halves of
  `n_half` blocked separately (gate_up: gate's blocks, then up's) → q·s;
- int4: two nibbles per byte along K (even k low), scale fp16 / zero uint8 [rows, ceil(K/GROUP)]
  → (q - z)·s;
- mxfp4: E2M1 nibbles along K, E8M0 scale bytes [rows, ceil(K/32)] → value·2^(e - 127).
The arithmetic is exact (integers and powers of two times a scale, rounded once), so a
tile equals the fp32 reference's dequantised weights bit for bit.

`dequant` indexes every weight (and its scale) by its own (r, k): the prefill GEMM's tiles.
`dequant_rows` is the decode GEMV's: a [ROWS, SUB] slab of whole rows loaded as vectors
(nibbles as int32 words, or bytes, unpacked in registers) with one scale per row per
GW-wide piece, broadcast — never a scale load per weight — and integers turned into
floats by their bits (`_biased`, `_code`), not by the int-to-float conversion (a fraction
of the FMA rate).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import e4m3_to_f32
from edgemoe.quant import ExpertFormat, Fp8Block, Int4Group, Int8Channel, Mxfp4

FMT_INT8, FMT_FP8, FMT_INT4, FMT_MXFP4 = 1, 2, 3, 4


def format_code(fmt: ExpertFormat) -> tuple[int, int]:
    """(FMT code, GROUP: fp8 block / int4 group / 32) of a quantised format."""
    if isinstance(fmt, Int8Channel):
        return FMT_INT8, 1
    if isinstance(fmt, Fp8Block):
        return FMT_FP8, fmt.block
    if isinstance(fmt, Int4Group):
        return FMT_INT4, fmt.group
    if isinstance(fmt, Mxfp4):
        return FMT_MXFP4, 32
    raise TypeError(f"no Triton dequantisation for {fmt.label}")


@triton.jit
def _nibble(data, r64, k, mask, stride_d):
    byte = tl.load(data + r64 * stride_d + k // 2, mask=mask, other=0).to(tl.int32)
    return (byte >> ((k % 2) * 4)) & 0xF


@triton.jit
def _e2m1(code):
    """E2M1 codes (int32; bits above the low 4 ignored) → fp32, exactly, in a few integer ops:
    the sign bit moved to an fp16's sign and the 3 magnitude bits (e1 e0 m) to its exponent's
    low two bits and its first mantissa bit read that fp16 as (1 + m/2)·2^(e-15) for e ≥ 1 and,
    for e = 0, the subnormal m·2^-15: times 2^14, E2M1's (1 + m/2)·2^(e-1) and 0.5·m.
    (The old form, exponent and mantissa apart and two selects, cost ~12 ALU ops a weight,
    which held gpt-oss's MXFP4 decode GEMV at ~0.4 TB/s, below bf16's.)"""
    h = ((code & 8) << 12) | ((code & 7) << 9)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 16384.0


@triton.jit
def _e8m0(e8):
    """E8M0 scale bytes (int32) → 2^(e8 - 127) from its bits; e8 = 0 (2^-127) is an fp32 subnormal."""
    return tl.where(e8 == 0, 0x00400000, e8 << 23).to(tl.float32, bitcast=True)


@triton.jit
def dequant(data, scale, zero, r, k, mask, n_half, stride_d, stride_s, FMT: tl.constexpr, GROUP: tl.constexpr,
            FP8HW: tl.constexpr):
    r64 = r.to(tl.int64)
    if FMT == 1:
        q = tl.load(data + r64 * stride_d + k, mask=mask, other=0).to(tl.float32)
        w = q * tl.load(scale + r64 * stride_s, mask=mask, other=0.0)
    elif FMT == 2:
        q = e4m3_to_f32(tl.load(data + r64 * stride_d + k, mask=mask, other=0), FP8HW)
        rb = (r // n_half) * tl.cdiv(n_half, GROUP) + (r % n_half) // GROUP
        w = q * tl.load(scale + rb.to(tl.int64) * stride_s + k // GROUP, mask=mask, other=0.0)
    elif FMT == 3:
        g = k // GROUP
        s = tl.load(scale + r64 * stride_s + g, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(zero + r64 * stride_s + g, mask=mask, other=0).to(tl.float32)
        w = (_nibble(data, r64, k, mask, stride_d).to(tl.float32) - z) * s
    else:
        e8 = tl.load(scale + r64 * stride_s + k // GROUP, mask=mask, other=127).to(tl.int32)
        w = _e2m1(_nibble(data, r64, k, mask, stride_d)) * _e8m0(e8)
    return w


BIAS = tl.constexpr(8388608.0)  # 2^23: `_biased` adds it


@triton.jit
def _biased(v):
    """Integers 0 <= v < 2^23 (int32) → fp32 2^23 + v, exactly: v's bits OR'd into 2^23's
    mantissa. A difference of two such values is the integers' difference, exact."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def scale_rows(rows, half, n_half, FMT: tl.constexpr, GROUP: tl.constexpr):
    """Scale-bank rows of the weight rows half * n_half + rows (rows < n_half; half 1: gate_up's
    up rows): fp8 blocks each half's rows by GROUP (gate's blocks, then up's); the other
    formats keep a scale row per weight row."""
    if FMT == 2:
        s = half * tl.cdiv(n_half, GROUP) + rows // GROUP
    else:
        s = half * n_half + rows
    return s


@triton.jit
def _pieces(q, z, s, SUB: tl.constexpr, GW: tl.constexpr, HAS_Z: tl.constexpr):
    """(q - z) · s (HAS_Z; else q · s) for q [ROWS, SUB] and z, s [ROWS, SUB / GW]: each
    GW-wide piece of a row takes its own z, s. The reshapes keep each thread's elements in
    place (a thread's contiguous run lies within one piece): no data movement."""
    if GW == SUB:
        if HAS_Z:
            q = q - z
        w = q * s
    else:
        q3 = tl.reshape(q, [q.shape[0], SUB // GW, GW])
        if HAS_Z:
            q3 = q3 - z[:, :, None]
        w = tl.reshape(q3 * s[:, :, None], [q.shape[0], SUB])
    return w


@triton.jit
def _code(w, SHIFT: tl.constexpr):
    """The 4 bits of w (int32) at SHIFT in `_biased`'s form: 2^23's bits OR'd in (a shift,
    a bit-field extract and an OR on sm_90)."""
    return ((w >> SHIFT) & 0xF) | 0x4B000000


@triton.jit
def _nibble_codes(data, r64, row_ok, k0, n_store, stride_d, SUB: tl.constexpr, WORDS: tl.constexpr):
    """The 4-bit codes of columns [k0, k0 + SUB) of rows r64, int32 [ROWS, SUB]. WORDS: the
    data read as int32 words (8 codes each, code j at bits 4j: little-endian bytes, low
    nibble first), one shift and mask a code, put in column order by interleaving; else as
    bytes, each widened to int32 first (a byte extract more a pair of codes)."""
    if WORDS:
        jw = k0 // 8 + tl.arange(0, SUB // 8)
        w = tl.load(data + r64 * stride_d + jw[None, :], mask=row_ok[:, None] & (jw < n_store)[None, :], other=0)
        even = tl.interleave(tl.interleave(_code(w, 0), _code(w, 16)), tl.interleave(_code(w, 8), _code(w, 24)))
        odd = tl.interleave(tl.interleave(_code(w, 4), _code(w, 20)), tl.interleave(_code(w, 12), _code(w, 28)))
        code = tl.interleave(even, odd)
    else:
        jb = k0 // 2 + tl.arange(0, SUB // 2)
        b = tl.load(data + r64 * stride_d + jb[None, :], mask=row_ok[:, None] & (jb < n_store)[None, :], other=0)
        b = b.to(tl.int32)
        code = tl.interleave(_code(b, 0), _code(b, 4))
    return code


@triton.jit
def dequant_rows(data, scale, zero, rows, srows, row_ok, k0, n, n_store, stride_d, stride_s,
                 FMT: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr, GW: tl.constexpr, FP8HW: tl.constexpr,
                 WORDS: tl.constexpr):
    """W[rows, k0 : k0 + SUB] of one slot's bank in fp32, [ROWS, SUB], 0 at columns >= n and
    in rows not `row_ok`. `srows`: the rows' scale rows (`scale_rows`); k0: a multiple of SUB;
    n_store: a data row's length in its storage type (n; nibbles: ceil(n / 2) bytes, or with
    WORDS the int32 words the host viewed them as, `_nibble_codes`); GW:
    columns sharing a scale, a power of two dividing SUB and GROUP
    (`moe_gemv_q_tiles.scale_cols`), so every GW-wide piece lies in one group."""
    r64 = rows.to(tl.int64)[:, None]
    kc = k0 + tl.arange(0, SUB // GW) * GW  # each piece's first column
    s_ok = row_ok[:, None] & (kc < n)[None, :]
    s_at = scale + srows.to(tl.int64)[:, None] * stride_s
    if FMT == 1 or FMT == 2:  # a byte a weight
        cols = k0 + tl.arange(0, SUB)
        b = tl.load(data + r64 * stride_d + cols[None, :], mask=row_ok[:, None] & (cols < n)[None, :], other=0)
        if FMT == 1:  # int8 q: q + 128 is its byte with bit 7 flipped; one scale per row
            q = _biased(b.to(tl.uint8, bitcast=True).to(tl.int32) ^ 0x80) - (BIAS + 128.0)
            s = tl.load(s_at + 0 * kc[None, :], mask=s_ok, other=0.0)
            w = _pieces(q, s, s, SUB, GW, False)
        else:
            s = tl.load(s_at + kc[None, :] // GROUP, mask=s_ok, other=0.0)
            w = _pieces(e4m3_to_f32(b, FP8HW), s, s, SUB, GW, False)
    else:  # two nibbles a byte along k, even k in the low one
        code = _nibble_codes(data, r64, row_ok, k0, n_store, stride_d, SUB, WORDS)
        if FMT == 3:
            s = tl.load(s_at + kc[None, :] // GROUP, mask=s_ok, other=0.0).to(tl.float32)
            z = tl.load(zero + srows.to(tl.int64)[:, None] * stride_s + kc[None, :] // GROUP, mask=s_ok, other=0)
            w = _pieces(code.to(tl.float32, bitcast=True), _biased(z.to(tl.int32)), s, SUB, GW, True)
        else:
            e8 = tl.load(s_at + kc[None, :] // GROUP, mask=s_ok, other=127).to(tl.int32)
            two = _e8m0(e8)
            w = _pieces(_e2m1(code), two, two, SUB, GW, False)
    return w
