"""Helpers shared by the Triton kernels: dtype mapping, exact rounding, dots, activations.

The interpreter (`TRITON_INTERPRET=1`, CPU tensors) differs from the compiled path in
two ways these helpers hide, so one kernel source serves both:
- it truncates fp32 → bf16 casts (the GPU rounds to nearest even);
- its `tl.dot` multiplies the raw uint16 storage of bf16 operands.
Kernels take `INTERP: tl.constexpr` (True exactly when the tensors are on the CPU).

The decode step's kernels also take `USE_PDL: tl.constexpr` (programmatic dependent
launch, `backend.pdl_enabled`) and call `pdl_start` first (docs/kernels.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "gelu_pytorch_tanh": 2}


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    if dtype not in TL_DTYPES:
        raise TypeError(f"unsupported dtype {dtype} (bf16, fp16 or fp32)")
    return TL_DTYPES[dtype]


def interpreting(t: torch.Tensor) -> bool:
    """Triton runs CPU tensors only under its interpreter."""
    return not t.is_cuda


def fp8_hardware(t: torch.Tensor) -> bool:
    """Whether Triton has the e4m3 type on `t`'s device: sm_89+ (and the interpreter).
    Elsewhere (sm_80/86) fp8 bytes are converted with integer arithmetic (`e4m3_to_f32`)."""
    return not t.is_cuda or torch.cuda.get_device_capability(t.device) >= (8, 9)


@triton.jit
def pdl_start(USE_PDL: tl.constexpr):
    """Programmatic dependent launch: wait until the previous kernel in the stream has
    completed and its writes are visible (`griddepcontrol.wait`), then let the next
    kernel's programs be scheduled while this one runs (they wait in their own
    `pdl_start`). With USE_PDL False the branch folds away: the kernel compiles as before,
    and the interpreter never traces the instructions.

    NOTE: call it first, in every program, before any load or store of a tensor another
    kernel reads or writes, and before any early return: a program that skipped the wait
    could finish before the previous kernel does, and the next kernel (which waits for
    this one only) would then read stale data.
    """
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def round_to(x, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """fp32 → DTYPE, round to nearest even (what torch's casts do)."""
    if INTERP:
        if DTYPE == tl.bfloat16:
            # The interpreter truncates: round the fp32 bits first so truncation is exact.
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(DTYPE)


@triton.jit
def to_e4m3(x, INTERP: tl.constexpr):
    """fp32 (|x| <= 448) → float8e4nv, round to nearest even (what the GPU's cvt does).
    The interpreter's cast neither rounds nor saturates: round the fp32 first, so its cast
    of an exactly representable value is exact (normals: 3 mantissa bits; below 2^-6,
    multiples of 2^-9, rounded with the 1.5·2^23 trick). Its cast also drops the sign of
    -0 (and of values rounded to 0): the sign bit is set on the byte, as cvt keeps it."""
    if INTERP:
        a = tl.minimum(tl.abs(x), 448.0)
        bits = a.to(tl.uint32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        sub = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
        r = tl.where(a >= 0.015625, normal, sub)
        sign = ((x.to(tl.uint32, bitcast=True) >> 31) << 7).to(tl.uint8)
        y = (r.to(tl.float8e4nv).to(tl.uint8, bitcast=True) | sign).to(tl.float8e4nv, bitcast=True)
    else:
        y = x.to(tl.float8e4nv)
    return y


@triton.jit
def e4m3_to_f32(b, FP8HW: tl.constexpr):
    """uint8 e4m3fn bytes → fp32, exact (NaN bytes aside). Without the hardware type: the
    7 exponent/mantissa bits moved into an fp32 and rebiased (+120) for normals, m·2^-9 for
    the subnormals."""
    if FP8HW:
        v = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        m = (b & 0x7F).to(tl.int32)
        normal = ((m << 20) + (120 << 23)).to(tl.float32, bitcast=True)
        mag = tl.where(m < 8, m.to(tl.float32) * 0.001953125, normal)
        v = tl.where((b & 0x80) != 0, -mag, mag)
    return v


@triton.jit
def f32_to_e4m3(x, FP8HW: tl.constexpr, INTERP: tl.constexpr):
    """fp32 (|x| <= 448) → uint8 e4m3fn bytes, round to nearest even (the sign of -0 kept)."""
    if FP8HW:
        out = to_e4m3(x, INTERP).to(tl.uint8, bitcast=True)
    else:
        a = tl.minimum(tl.abs(x), 448.0)
        bits = a.to(tl.uint32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        sub = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
        r = tl.where(a >= 0.015625, normal, sub)
        code = tl.where(r >= 0.015625, (r.to(tl.uint32, bitcast=True) >> 20) - 960, (r * 512.0).to(tl.uint32))
        out = (code | ((x.to(tl.uint32, bitcast=True) >> 31) << 7)).to(tl.uint8)
    return out


@triton.jit
def round_trip(x, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """fp32 value rounded to DTYPE and back: a torch op's rounded output, kept in fp32."""
    return round_to(x, DTYPE, INTERP).to(tl.float32)


@triton.jit
def mma(a, b, acc, INTERP: tl.constexpr):
    """acc + a @ b in fp32; fp32 operands multiply in full precision (no tf32)."""
    if INTERP:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    elif a.dtype == tl.float32:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def activate(x, ACT: tl.constexpr):
    """torch's formulas on fp32 x: 0 = silu, 1 = gelu (erf), 2 = gelu (tanh approximation)."""
    if ACT == 0:
        y = x / (1.0 + tl.exp(-x))
    elif ACT == 1:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    else:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)  # tanh via exp: no libdevice needed
        y = 0.5 * x * (1.0 + tanh)
    return y


@triton.jit
def exp_torch(x, INTERP: tl.constexpr):
    """fp32 exp as torch's CUDA kernels compute it: CUDA's `expf` (libdevice's `__nv_expf`).
    NOTE: not `tl.exp`, which lowers to ex2.approx of x·log2(e), a few ulps off `expf`.
    The interpreter has no libdevice: there exp runs in fp64 and rounds once (a correctly
    rounded fp32 exp, within an ulp of torch's CPU exp; numpy's fp32 exp is further off)."""
    if INTERP:
        y = tl.exp(x.to(tl.float64)).to(tl.float32)
    else:
        y = libdevice.exp(x)
    return y


@triton.jit
def silu_torch(x, INTERP: tl.constexpr):
    """torch's fp32 SiLU, x / (1 + exp(-x)), with an IEEE division (`/` in Triton is
    div.full.f32, not correctly rounded; torch's CUDA division is)."""
    return tl.div_rn(x, 1.0 + exp_torch(-x, INTERP))


@triton.jit
def sigmoid_torch(x, INTERP: tl.constexpr):
    """torch's fp32 sigmoid, 1 / (1 + exp(-x)), IEEE division (see `silu_torch`)."""
    return tl.div_rn(tl.zeros_like(x) + 1.0, 1.0 + exp_torch(-x, INTERP))
