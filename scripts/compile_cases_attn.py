"""The compile check's paged attention kernels (`scripts/triton_compile_check.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import triton.language as tl
from compile_case import Case

from edgemoe.kernels import attn_decode_tiles
from edgemoe.kernels.triton_ops import attn_decode, attn_extend


def attention_cases(act: tl.dtype) -> Iterator[Case]:
    """Paged attention: the decode split at head dims 64/128/256 (fp8 caches by integer
    decode and by the e4m3 type), the extend kernel likewise, the decode merge; with
    attention sinks (gpt-oss, HEAD_DIM 64: `HAS_SINKS`), the extend kernel (bf16 and fp8
    caches) and the merge, the only kernels that read them."""
    f32 = "fp32"
    ints = {"pt_ptr": "i32", "rows_ptr": "i32", "lens_ptr": "i32", "cu_ptr": "i32", "ks_ptr": f32, "vs_ptr": f32,
            "sinks_ptr": f32}
    t = attn_decode_tiles.tiles()
    for d in (64, 128, 256):
        for fp8 in (False, True):
            kv = {"k_ptr": "u8", "v_ptr": "u8"} if fp8 else {}
            tag = " fp8 kv" if fp8 else ""
            for hw in (False, True) if fp8 else (False,):  # e4m3 type on sm_89+, integer decode before
                yield Case(f"decode split D={d}{tag}{' e4m3 type' if hw else ''}", attn_decode._decode_split,
                           dict(G=8, G_PAD=16, D=d, D_PAD=d, BLOCK_N=attn_decode_tiles.block_n_for(t, d),
                                SPLITS=t.splits, MIN_BLOCKS=t.min_blocks, DTYPE=act, INTERP=False, FP8KV=fp8,
                                FP8HW=hw, STAGES=t.stages, LONG_BLOCKS=t.long_blocks, LONG_STAGES=t.long_stages),
                           t.warps, t.stages,
                           ptrs={**ints, **kv, "o_ptr": f32, "lse_ptr": f32}, min_arch=89 if hw else 80)
            block_m, block_n, warps, stages = attn_extend.extend_config(d)
            for sinks in (False, True) if d == 64 else (False,):
                yield Case(f"extend D={d}{tag}{' sinks' if sinks else ''}", attn_extend._extend,
                           dict(G=8, D=d, D_PAD=d, BLOCK_M=block_m, BLOCK_N=block_n, DTYPE=act, INTERP=False,
                                FP8KV=fp8, FP8HW=False, HAS_SINKS=sinks), warps, stages, ptrs={**ints, **kv})
    for d, sinks in ((128, False), (64, True)):
        yield Case("decode merge" + (f" D={d} sinks" if sinks else ""), attn_decode._decode_merge,
                   dict(D=d, D_PAD=d, SPLITS=t.splits, BLOCK_N=t.block_n, MIN_BLOCKS=t.min_blocks, DTYPE=act,
                        INTERP=False, CHUNK=t.merge_chunk, WIDE_SPLITS=t.wide_splits, WIDE_CHUNK=t.wide_chunk,
                        HAS_SINKS=sinks),
                   attn_decode_tiles.merge_warps(t, d), ptrs={**ints, "o_ptr": f32, "lse_ptr": f32})
