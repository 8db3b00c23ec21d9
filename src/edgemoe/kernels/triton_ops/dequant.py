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
        code = _nibble(data, r64, k, mask, stride_d)
        e, m = (code >> 1) & 3, (code & 1).to(tl.float32)
        # E2M1: exponent 0 holds 0 and 0.5; else (1 + m/2)·2^(e-1) = (2 + m)·2^e / 4
        pow_e = ((e + 127) << 23).to(tl.float32, bitcast=True)  # 2^e, exact
        mag = tl.where(e == 0, 0.5 * m, (2.0 + m) * pow_e * 0.25)
        e8 = tl.load(scale + r64 * stride_s + k // GROUP, mask=mask, other=127).to(tl.int32)
        # 2^(e8 - 127) from its bits; e8 = 0 (2^-127) is an fp32 subnormal
        two = tl.where(e8 == 0, 0x00400000, e8 << 23).to(tl.float32, bitcast=True)
        w = tl.where((code & 8) != 0, -mag, mag) * two
    return w
