"""Compile every Triton kernel of edgemoe.kernels for NVIDIA targets, without a GPU.

Triton's wheel ships ptxas, so the compiled path (not the interpreter's) is checked on
any machine: a kernel that only the interpreter accepts fails here, and each kernel's
shared memory must fit the target's per-block limit (sm_86/sm_89, the consumer cards,
have ~99 KiB). Usage: python scripts/triton_compile_check.py [--arch 80 86 89 90] [--dtype bf16 fp16 fp32]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # NOTE: before any kernel module is imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from edgemoe.kernels.triton_ops import attn_decode, attn_extend, moe_combine, moe_gemm, moe_gemv, norm, rope  # noqa: E402

SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}  # bytes per block
DTYPES = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}
FLOATS = {"eps", "qk_scale", "weight_offset"}


@dataclass
class Case:
    name: str
    kernel: Any  # a JITFunction
    consts: dict[str, Any]
    warps: int
    stages: int = 2
    ptrs: dict[str, str] = field(default_factory=dict)  # pointer element types other than the activation's


def cases(dtype: tl.dtype) -> Iterator[Case]:
    act = dtype
    i32, f32 = {"slot_ptr": "i32", "sorted_ptr": "i32", "block_slot_ptr": "i32"}, "fp32"
    yield Case("moe gate_up gemv", moe_gemv._gate_up_gemv, dict(ACT=0, DTYPE=act, ROWS=moe_gemv.GU_ROWS,
               COLS=moe_gemv.GU_COLS, INTERP=False), moe_gemv.GU_WARPS, ptrs=i32)
    yield Case("moe down gemv", moe_gemv._down_gemv, dict(DTYPE=act, ROWS=moe_gemv.DOWN_ROWS,
               COLS=moe_gemv.DOWN_COLS, INTERP=False), moe_gemv.DOWN_WARPS, ptrs={**i32, "w_ptr": f32, "cells_ptr": f32})
    yield Case("moe gate_up gemm", moe_gemm._gate_up_gemm, dict(ACT=2, DTYPE=act, BM=moe_gemm.BLOCK_M,
               BN=moe_gemm.GU_N, BK=moe_gemm.GU_K, INTERP=False), moe_gemm.GU_WARPS, moe_gemm.GU_STAGES, ptrs=i32)
    yield Case("moe down gemm", moe_gemm._down_gemm, dict(DTYPE=act, BM=moe_gemm.BLOCK_M, BN=moe_gemm.DOWN_N,
               BK=moe_gemm.DOWN_K, INTERP=False), moe_gemm.DOWN_WARPS, moe_gemm.DOWN_STAGES,
               ptrs={**i32, "w_ptr": f32, "cells_ptr": f32})
    yield Case("moe combine", moe_combine._combine, dict(HAS_RES=True, DTYPE=act, BLOCK=moe_combine.COMBINE_BLOCK,
               INTERP=False), moe_combine.COMBINE_WARPS, ptrs={"cells_ptr": f32})
    ints = {"pt_ptr": "i32", "rows_ptr": "i32", "lens_ptr": "i32", "cu_ptr": "i32"}
    for d in (64, 128, 256):
        block_n, warps, stages = attn_decode.decode_config(d)
        yield Case(f"decode split D={d}", attn_decode._decode_split, dict(G=8, G_PAD=16, D=d, D_PAD=d,
                   BLOCK_N=block_n, SPLITS=attn_decode.NUM_SPLITS, DTYPE=act, INTERP=False), warps, stages,
                   ptrs={**ints, "o_ptr": f32, "lse_ptr": f32})
        block_m, block_n, warps, stages = attn_extend.extend_config(d)
        yield Case(f"extend D={d}", attn_extend._extend, dict(G=8, D=d, D_PAD=d, BLOCK_M=block_m, BLOCK_N=block_n,
                   DTYPE=act, INTERP=False), warps, stages, ptrs=ints)
    yield Case("decode merge", attn_decode._decode_merge, dict(D=128, D_PAD=128, SPLITS=attn_decode.NUM_SPLITS, BLOCK_N=64,
               DTYPE=act, INTERP=False), 1, ptrs={**ints, "o_ptr": f32, "lse_ptr": f32})
    yield Case("add rms norm", norm._rms_norm, dict(HAS_RES=True, OFFSET=True, DTYPE=act, BLOCK=2048, INTERP=False), 8)
    yield Case("rope + kv write", rope._rope_write_kv, dict(HALF=32, HQ_PAD=32, HKV_PAD=4, D_PAD=256, DTYPE=act,
               CACHE_DTYPE=act, INTERP=False), 4, ptrs={"pos_ptr": "i64", "loc_ptr": "i64", "cos_ptr": f32, "sin_ptr": f32})


def compile_case(case: Case, arch: int, dtype_name: str) -> int:
    """Compiles one kernel; returns its shared memory in bytes."""
    params = {p.name: p for p in case.kernel.params}
    sig: dict[str, str] = {}
    for name, p in params.items():
        if p.is_constexpr:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + case.ptrs.get(name, dtype_name)
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    src = ASTSource(case.kernel, sig, case.consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": case.warps, "num_stages": case.stages})
    return int(compiled.metadata.shared)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 86, 89, 90], choices=sorted(SHARED_LIMIT))
    ap.add_argument("--dtype", nargs="+", default=["bf16"], choices=sorted(DTYPES))
    args = ap.parse_args(argv)
    failures = 0
    for dtype_name in args.dtype:
        for case in cases(DTYPES[dtype_name]):
            for arch in args.arch:
                try:
                    shared = compile_case(case, arch, dtype_name)
                    ok = shared <= SHARED_LIMIT[arch]
                    print(f"{'ok  ' if ok else 'FAIL'} sm_{arch} {dtype_name} {case.name}: {shared} B shared")
                except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
                    ok = False
                    print(f"FAIL sm_{arch} {dtype_name} {case.name}: {type(exc).__name__}: {exc}")
                failures += not ok
    print(f"{failures} failure(s); torch {torch.__version__}, triton {triton.__version__}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
