"""The compile check's MoE expert kernels (`scripts/triton_compile_check.py`): the bf16 decode
GEMV, the quantised GEMV and GEMM of every format, and gpt-oss's biased experts."""

from __future__ import annotations

from collections.abc import Iterator

import triton.language as tl
from compile_case import Case

from edgemoe.kernels import moe_gemv_q_tiles
from edgemoe.kernels.triton_ops import moe_gemm, moe_gemm_q, moe_gemv, moe_gemv_q


def bf16_gemv_cases(act: tl.dtype) -> Iterator[Case]:
    """The bf16 decode GEMV's two kernels at the default tiles, with split-K (fp32 partials
    written by gate_up, summed by down), and software-pipelined (3 stages: async copies of
    the weight and activation tiles through shared memory)."""
    i32, f32 = {"slot_ptr": "i32"}, "fp32"
    t = moe_gemv.tiles()
    for splits, gu_stages, dn_stages in ((1, t.gu_stages, t.down_stages), (4, t.gu_stages, t.down_stages), (1, 3, 3)):
        part = {"inter_ptr": f32} if splits > 1 else {}
        tag = f"S={splits}" + (f" {gu_stages} stages" if gu_stages != t.gu_stages else "")
        yield Case(f"moe gate_up gemv {tag}", moe_gemv._gate_up_gemv, dict(ACT=0, DTYPE=act, ROWS=t.gu_rows,
                   COLS=t.gu_cols, SPLITS=splits, STAGES=gu_stages, INTERP=False), t.gu_warps, ptrs={**i32, **part})
        yield Case(f"moe down gemv {tag}", moe_gemv._down_gemv, dict(ACT=0, DTYPE=act, ROWS=t.down_rows,
                   COLS=t.down_cols, SPLITS=splits, STAGES=dn_stages, INTERP=False), t.down_warps,
                   ptrs={**i32, **part, "w_ptr": f32, "cells_ptr": f32})


QUANT_FORMATS = {"int8": (1, 1, "i8", "fp32", "fp32"), "fp8": (2, 128, "u8", "fp32", "fp32"),
                 "int4": (3, 128, "u8", "fp16", "u8"), "mxfp4": (4, 32, "u8", "u8", "u8")}


def quant_gemv_cases(act: tl.dtype, name: str, tiles: moe_gemv_q_tiles.MoeGemvQTiles, tag: str = "") -> Iterator[Case]:
    """The quantised decode GEMV's two kernels of one format at `tiles`; nibble formats
    read their data as int32 words (the real shapes' rows are whole words)."""
    code, group, data, scale, zero = QUANT_FORMATS[name]
    nibbles = code in (3, 4)
    data = "i32" if nibbles else data
    i32, f32 = {"slot_ptr": "i32"}, "fp32"
    gu = {"gu_ptr": data, "gus_ptr": scale, "guz_ptr": zero}
    dn = {"dn_ptr": data, "dns_ptr": scale, "dnz_ptr": zero}
    q = dict(FMT=code, GROUP=group, INTERP=False, FP8HW=False, WORDS=nibbles)
    sub, gw = moe_gemv_q.step_widths(code, group, tiles.gu_rows, tiles.gu_cols, tiles.gu_warps)
    yield Case(f"moe gate_up gemv {name}{tag}", moe_gemv_q._gate_up_gemv_q, dict(
               ACT=0, DTYPE=act, ROWS=tiles.gu_rows, COLS=tiles.gu_cols, SUB=sub, GW=gw, STAGES=tiles.gu_stages, **q),
               tiles.gu_warps, ptrs={**i32, **gu})
    if name == "fp8" and not tag:  # sm_89+ converts through the e4m3 type
        yield Case("moe gate_up gemv fp8 e4m3 type", moe_gemv_q._gate_up_gemv_q, dict(
                   ACT=0, DTYPE=act, ROWS=tiles.gu_rows, COLS=tiles.gu_cols, SUB=sub, GW=gw, STAGES=tiles.gu_stages,
                   **(q | {"FP8HW": True})), tiles.gu_warps, ptrs={**i32, **gu}, min_arch=89)
    sub, gw = moe_gemv_q.step_widths(code, group, tiles.down_rows, tiles.down_cols, tiles.down_warps)
    yield Case(f"moe down gemv {name}{tag}", moe_gemv_q._down_gemv_q, dict(
               DTYPE=act, ROWS=tiles.down_rows, COLS=tiles.down_cols, SUB=sub, GW=gw, STAGES=tiles.down_stages, **q),
               tiles.down_warps, ptrs={**i32, **dn, "w_ptr": f32, "cells_ptr": f32})


def quant_moe_cases(act: tl.dtype) -> Iterator[Case]:
    """The fused MoE kernels over quantised banks (moe_gemv_q at each format's default
    tiles, and pipelined; moe_gemm_q), every format; fp8 also with fp8 tensor-core MMAs
    (sm_89+)."""
    i32, f32 = {"slot_ptr": "i32", "sorted_ptr": "i32", "block_slot_ptr": "i32"}, "fp32"
    for name, (code, group, data, scale, zero) in QUANT_FORMATS.items():
        default = moe_gemv_q_tiles.DEFAULTS[name]
        yield from quant_gemv_cases(act, name, default)
        # software-pipelined steps (shared memory: 3 stages of weights and activations)
        yield from quant_gemv_cases(act, name, default._replace(gu_stages=3, down_stages=3), " 3 stages")
        gu = {"gu_ptr": data, "gus_ptr": scale, "guz_ptr": zero}
        dn = {"dn_ptr": data, "dns_ptr": scale, "dnz_ptr": zero}
        q = dict(FMT=code, GROUP=group, INTERP=False, FP8HW=False)
        for f8 in (False, True) if name == "fp8" and act != tl.float32 else (False,):
            bk = moe_gemm_q.F8_K if f8 else moe_gemm_q.GU_K
            tag = " fp8 mma" if f8 else ""
            q8 = q | {"FP8HW": f8}  # the fp8 MMA path needs the e4m3 type: sm_89+
            yield Case(f"moe gate_up gemm {name}{tag}", moe_gemm_q._gate_up_gemm_q, dict(ACT=0, DTYPE=act,
                       BM=moe_gemm_q.BLOCK_M, BN=moe_gemm_q.GU_N, BK=bk, F8DOT=f8, **q8), moe_gemm_q.GU_WARPS,
                       moe_gemm_q.GU_STAGES, ptrs={**i32, **gu}, min_arch=89 if f8 else 80)
            yield Case(f"moe down gemm {name}{tag}", moe_gemm_q._down_gemm_q, dict(DTYPE=act, BM=moe_gemm_q.BLOCK_M,
                       BN=moe_gemm_q.DOWN_N, BK=bk, F8DOT=f8, **q8), moe_gemm_q.DOWN_WARPS, moe_gemm_q.DOWN_STAGES,
                       ptrs={**i32, **dn, "w_ptr": f32, "cells_ptr": f32}, min_arch=89 if f8 else 80)


def biased_moe_cases(act: tl.dtype) -> Iterator[Case]:
    """gpt-oss's experts (biases by expert id, the clamped SwiGLU: ACT 3) in the bf16 decode
    GEMV with split-K, the prompt GEMM and mxfp4's GEMV and GEMM, at their default tiles."""
    ids, f32, t = {"slot_ptr": "i32", "sorted_ptr": "i32", "block_slot_ptr": "i32", "eid_ptr": "i32"}, "fp32", moe_gemv.tiles()
    oai = dict(HAS_BIAS=True, ACT=3, ALPHA=1.702, LIMIT=7.0, DTYPE=act, INTERP=False)
    down = {**ids, "inter_ptr": f32, "w_ptr": f32, "cells_ptr": f32}
    yield Case("moe gate_up gemv S=4 biased oai", moe_gemv._gate_up_gemv, dict(ROWS=t.gu_rows, COLS=t.gu_cols,
               SPLITS=4, STAGES=t.gu_stages, **oai), t.gu_warps, ptrs={**ids, "inter_ptr": f32})
    yield Case("moe down gemv S=4 biased oai", moe_gemv._down_gemv, dict(ROWS=t.down_rows, COLS=t.down_cols,
               SPLITS=4, STAGES=t.down_stages, **oai), t.down_warps, ptrs=down)
    yield Case("moe gate_up gemm biased oai", moe_gemm._gate_up_gemm, dict(BM=moe_gemm.BLOCK_M, BN=moe_gemm.GU_N,
               BK=moe_gemm.GU_K, **oai), moe_gemm.GU_WARPS, moe_gemm.GU_STAGES, ptrs=ids)
    yield Case("moe down gemm biased", moe_gemm._down_gemm, dict(HAS_BIAS=True, DTYPE=act, BM=moe_gemm.BLOCK_M,
               BN=moe_gemm.DOWN_N, BK=moe_gemm.DOWN_K, INTERP=False), moe_gemm.DOWN_WARPS, moe_gemm.DOWN_STAGES,
               ptrs={**ids, "w_ptr": f32, "cells_ptr": f32})
    code, group, data, scale, zero = QUANT_FORMATS["mxfp4"]
    q, tq = dict(FMT=code, GROUP=group, FP8HW=False), moe_gemv_q_tiles.DEFAULTS["mxfp4"]
    gu, dn = {"gu_ptr": data, "gus_ptr": scale, "guz_ptr": zero}, {"dn_ptr": data, "dns_ptr": scale, "dnz_ptr": zero}
    sub, gw = moe_gemv_q.step_widths(code, group, tq.gu_rows, tq.gu_cols, tq.gu_warps)
    yield Case("moe gate_up gemv mxfp4 biased oai", moe_gemv_q._gate_up_gemv_q, dict(ROWS=tq.gu_rows,
               COLS=tq.gu_cols, SUB=sub, GW=gw, STAGES=tq.gu_stages, WORDS=True, **q, **oai), tq.gu_warps,
               ptrs={**ids, **gu, "gu_ptr": "i32"})
    sub, gw = moe_gemv_q.step_widths(code, group, tq.down_rows, tq.down_cols, tq.down_warps)
    yield Case("moe down gemv mxfp4 biased", moe_gemv_q._down_gemv_q, dict(HAS_BIAS=True, DTYPE=act, INTERP=False,
               ROWS=tq.down_rows, COLS=tq.down_cols, SUB=sub, GW=gw, STAGES=tq.down_stages, WORDS=True, **q),
               tq.down_warps, ptrs={**down, **dn, "dn_ptr": "i32"})
    yield Case("moe gate_up gemm mxfp4 biased oai", moe_gemm_q._gate_up_gemm_q, dict(BM=moe_gemm_q.BLOCK_M,
               BN=moe_gemm_q.GU_N, BK=moe_gemm_q.GU_K, F8DOT=False, **q, **oai), moe_gemm_q.GU_WARPS,
               moe_gemm_q.GU_STAGES, ptrs={**ids, **gu})
