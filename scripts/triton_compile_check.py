"""Compile every Triton kernel of edgemoe.kernels for NVIDIA targets, without a GPU.

Triton's wheel ships ptxas, so the compiled path (not the interpreter's) is checked on
any machine: a kernel that only the interpreter accepts fails here, and each kernel's
shared memory must fit the target's per-block limit (sm_86/sm_89, the consumer cards,
have ~99 KiB). Kernels with a `USE_PDL` constexpr compile with it False (their PTX must hold
no `griddepcontrol`), or with `--pdl` True, on sm_90+ only, and their PTX must hold both
`griddepcontrol.wait` and `griddepcontrol.launch_dependents` (programmatic dependent launch).
Usage: python scripts/triton_compile_check.py [--arch 80 86 89 90] [--dtype bf16 fp16 fp32] [--pdl] [--jobs N]
(`--jobs`: forked processes, each compiling every N-th kernel; default every CPU this process
may use; the lines print in the same order either way.)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import multiprocessing
import os
import re
import sys
from collections.abc import Callable, Iterator

os.environ.pop("TRITON_INTERPRET", None)  # NOTE: before any kernel module is imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from compile_case import Case  # noqa: E402
from compile_cases_attn import attention_cases  # noqa: E402
from compile_cases_moe import biased_moe_cases, bf16_gemv_cases, quant_moe_cases  # noqa: E402

from edgemoe.kernels import dense_gemv_tiles  # noqa: E402
from edgemoe.kernels.triton_ops import (  # noqa: E402
    causal_conv,
    dense_gemv,
    gated_norm,
    gdn_gates,
    hyper_connection,
    moe_combine,
    moe_gemm,
    norm,
    qsa,
    rope,
    router,
    router_sigmoid,
    row_gather,
    shared_gate,
    slot_plan,
)

SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024,
                121: 99 * 1024}  # bytes per block (121: DGX Spark's GB10)
DTYPES = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}
FLOATS = {"eps", "qk_scale", "weight_offset", "inv_hc", "sqrt_d", "route_scale"}


def cases(dtype: tl.dtype) -> Iterator[Case]:
    act = dtype
    i32, f32 = {"slot_ptr": "i32", "sorted_ptr": "i32", "block_slot_ptr": "i32"}, "fp32"
    yield from bf16_gemv_cases(act)
    yield Case("moe gate_up gemm", moe_gemm._gate_up_gemm, dict(ACT=2, DTYPE=act, BM=moe_gemm.BLOCK_M,
               BN=moe_gemm.GU_N, BK=moe_gemm.GU_K, INTERP=False), moe_gemm.GU_WARPS, moe_gemm.GU_STAGES, ptrs=i32)
    yield Case("moe down gemm", moe_gemm._down_gemm, dict(DTYPE=act, BM=moe_gemm.BLOCK_M, BN=moe_gemm.DOWN_N,
               BK=moe_gemm.DOWN_K, INTERP=False), moe_gemm.DOWN_WARPS, moe_gemm.DOWN_STAGES,
               ptrs={**i32, "w_ptr": f32, "cells_ptr": f32})
    yield Case("moe combine", moe_combine._combine, dict(HAS_RES=True, DTYPE=act, BLOCK=moe_combine.COMBINE_BLOCK,
               INTERP=False), moe_combine.COMBINE_WARPS, ptrs={"cells_ptr": f32})
    yield Case("moe combine + rms norm", moe_combine._combine_norm, dict(K=8, OFFSET=False, DTYPE=act, BLOCK=2048,
               INTERP=False), norm.norm_warps(2048), ptrs={"cells_ptr": f32})
    yield Case("moe combine + offset rms norm", moe_combine._combine_norm, dict(K=10, OFFSET=True, DTYPE=act,
               BLOCK=8192, INTERP=False), norm.norm_warps(8192), ptrs={"cells_ptr": f32})
    yield from quant_moe_cases(act)
    yield from biased_moe_cases(act)
    yield from attention_cases(act)
    yield Case("add rms norm", norm._rms_norm, dict(HAS_RES=True, OFFSET=True, DTYPE=act, BLOCK=2048, INTERP=False), 8)
    yield from rope_cases(act)
    yield from dense_gemv_cases(act)
    yield from router_cases(act)
    yield from hybrid_decode_cases(act)
    yield from slot_plan_cases()
    yield Case("row gather", row_gather._gather_rows, dict(BLOCK_D=256, ROWS=row_gather.ROWS), 4,
               ptrs={"ids_ptr": "i64"})
    yield from gather_into_cases()


def gather_into_cases() -> Iterator[Case]:
    """The mover's gather: one part (the PLE / sweep form), and an int4 expert's six
    (int32 weights, int16 scales, uint8 zero points: the bit widths `moe/movers._bits` gives)."""
    for parts, widths in ((1, ["i32"]), (6, ["i32", "i16", "u8"] * 2)):
        tables = {f"{side}{k}_ptr": widths[k % len(widths)] for k in range(row_gather.MAX_PARTS) for side in "to"}
        yield Case(f"row gather into, {parts} part(s)", row_gather._gather_parts_into,
                   dict(PARTS=parts, BLOCK_D=row_gather.BLOCK_INTO, CHUNK=row_gather.CHUNK_INTO), 4,
                   ptrs={"ids_ptr": "i32", "dst_ptr": "i32", **tables})


def rope_cases(act: tl.dtype) -> Iterator[Case]:
    """The rope + KV write, a program per (token, kv head): Qwen3-30B-A3B's group (8 q heads
    and 1 kv head of 128, HKV = 4), a partial rotary of D = 256 (Qwen3-Next's 16 / 2), an odd
    group padded (GLM-4.5's 96 / 8: 12 -> 16), one q head a kv head (OLMoE's 16 / 16), and MLA's
    20 heads over one 576-wide row whose value is its key, in chunks of heads (`rope.q_chunk`)."""
    ptrs = {"pos_ptr": "i64", "loc_ptr": "i64", "cos_ptr": "fp32", "sin_ptr": "fp32", "ks_ptr": "fp32",
            "vs_ptr": "fp32"}
    kernel, warps = rope._rope_write_kv, rope.NUM_WARPS
    plain = dict(DTYPE=act, CACHE_DTYPE=act, INTERP=False, FP8KV=False, FP8HW=False, HAS_V=True)
    yield Case("rope + kv write", kernel, dict(HKV=2, HKV_PAD=2, QG=8, QC=8, QC_PAD=8, CHUNKS=1, HALF=32, NORM=False,
               D_PAD=256, **plain), warps, ptrs=ptrs)
    # MLA's latent row: 20 q heads over one kv head of 576 (padded 1,024) in 5 chunks of 4, the value the key
    yield Case("rope + shared kv write, heads in chunks", kernel, dict(HKV=1, HKV_PAD=1, QG=20, QC=4, QC_PAD=4, CHUNKS=5,
               HALF=32, NORM=False, D_PAD=1024, **{**plain, "HAS_V": False}), warps, ptrs=ptrs)
    for name, hkv, qg, qg_pad in (("", 4, 8, 8), (" 12 q a kv head", 8, 12, 16), (" 1 q a kv head", 16, 1, 1)):
        yield Case(f"q/k head norms + rope + kv write{name}", kernel, dict(
                   HKV=hkv, HKV_PAD=hkv, QG=qg, QC=qg, QC_PAD=qg_pad, CHUNKS=1, HALF=64, NORM=True, D_PAD=128,
                   **plain), warps, ptrs=ptrs)
    for hw in (False, True):  # fp8 bytes by integer arithmetic (sm_80/86), or the e4m3 type (sm_89+)
        fp8 = dict(DTYPE=act, CACHE_DTYPE=tl.uint8, INTERP=False, FP8KV=True, FP8HW=hw, HAS_V=True)
        yield Case(f"head norms + rope + fp8 kv write{' e4m3 type' if hw else ''}", kernel, dict(
                   HKV=4, HKV_PAD=4, QG=8, QC=8, QC_PAD=8, CHUNKS=1, HALF=32, NORM=True, D_PAD=256, **fp8), warps,
                   ptrs={**ptrs, "kc_ptr": "u8", "vc_ptr": "u8"}, min_arch=89 if hw else 80)


def dense_gemv_cases(act: tl.dtype) -> Iterator[Case]:
    """The dense decode GEMV at its tiles (env override included) and at 1, 4 and 8 tokens
    a block (each TOKENS compiles a different number of accumulators)."""
    t = dense_gemv_tiles.tiles()
    for tokens in dict.fromkeys((t.tokens, 1, 4, 8)):
        yield Case(f"dense gemv {tokens} token(s) a block", dense_gemv._dense_gemv, dict(
                   DTYPE=act, ROWS=t.rows, COLS=t.cols, TOKENS=tokens, STAGES=t.stages, INTERP=False),
                   t.warps)
    yield Case("dense gemv biased", dense_gemv._dense_gemv, dict(DTYPE=act, ROWS=t.rows, COLS=t.cols, TOKENS=t.tokens,
               STAGES=t.stages, INTERP=False, HAS_BIAS=True), t.warps)  # GLM's q/k/v, gpt-oss's o_proj too


def router_cases(act: tl.dtype) -> Iterator[Case]:
    """Softmax/top-k alone, and fused with the router's projection (Qwen3-30B-A3B: E = 128,
    K = 8, H = 2048: one BLOCK_H load per program); the top-k by ranks at 128 and 256
    experts (unchunked, chunked), by search at 512 (Qwen3.8-Flash-Next); the projection
    fused with the residual add + RMSNorm in front of it too."""
    f32 = "fp32"
    for e_pad in (128, 256, 512):
        tag = "" if e_pad == 128 else f" E={e_pad}"
        warps = router.TOPK_WARPS if e_pad <= router.RANK_MAX_E_PAD else 4
        yield Case(f"route top-k{tag}", router._route_topk, dict(
                   K=8, K_PAD=8, E_PAD=e_pad, RENORM=True, DTYPE=act, INTERP=False,
                   RANK_CHUNK=router.rank_chunk(e_pad, warps)), warps, ptrs={"ids_ptr": "i32", "w_ptr": f32})
        yield fused_router_case(act, e_pad, 2048, None, f"router gemv + top-k{tag}")
    yield fused_router_case(act, 512, 2048, None, "router gemv + top-10 E=512", k=10)  # Qwen3.8: K padded to 16
    for offset in (False, True):
        name = f"add {'offset ' if offset else ''}rms norm + router gemv + top-k"
        yield fused_router_case(act, 128, 2048, offset, name)
    # gpt-oss-20b: 32 experts, top-4, H = 2,880 (two loads along H), the router's logit bias
    yield fused_router_case(act, 32, 2880, False, "add rms norm + biased router gemv + top-4 E=32", k=4, bias=True)
    # GLM-4.5-Air (128 experts, one group, the shared pair) and DeepSeek-V3's groups (256 in 8, 4 kept)
    for e_pad, groups, kept in ((128, 1, 1), (256, 8, 4)):
        yield Case(f"sigmoid route E={e_pad} groups={groups}", router_sigmoid._sigmoid_route, dict(
                   K=8, K_PAD=16, E_PAD=e_pad, G=groups, G_PAD=groups, GS_PAD=e_pad // groups, TOPK_G=kept,
                   RENORM=True, SHARED=1), 4, ptrs={"logits_ptr": f32, "bias_ptr": f32, "ids_ptr": "i32", "w_ptr": f32})


def fused_router_case(act: tl.dtype, e_pad: int, H: int, offset: bool | None, name: str, k: int = 8,
                      bias: bool = False) -> Case:
    """`_route_fused` at hidden size H, its warps and tiles; `offset` None: no norm."""
    warps = router.router_warps(H)
    return Case(name, router._route_fused, dict(
                K=k, K_PAD=triton.next_power_of_2(k), E_PAD=e_pad, RENORM=True, LOGIT_DTYPE=act, DTYPE=act, INTERP=False, BLOCK_E=router.BLOCK_E,
                BLOCK_H=min(triton.next_power_of_2(H), router.MAX_BLOCK_H), RANK_CHUNK=router.rank_chunk(e_pad, warps),
                NORM=offset is not None, OFFSET=bool(offset), BLOCK_N=triton.next_power_of_2(H), HAS_BIAS=bias), warps,
                ptrs={"logits_ptr": "fp32", "arrivals_ptr": "i32", "ids_ptr": "i32", "wout_ptr": "fp32"})


def hybrid_decode_cases(act: tl.dtype) -> Iterator[Case]:
    """The GDN / QSA / hyper-connection models' decode kernels at Qwen3.8-Flash-Next's shape
    (H = 2048 in 4 streams, rank 320; 32 value heads of 128; 8,192 conv channels, the PLE's
    dilated conv; 16 indexer heads of 128)."""
    f32, i64, i32 = "fp32", "i64", "i32"
    hc = hyper_connection
    for inject in (True, False):
        yield Case(f"hc norm{' + inject' if inject else ''}", hc._hc_norm, dict(
                   INJECT=inject, NORM=True, DTYPE=act, BLOCK=2048, INTERP=False), norm.norm_warps(2048),
                   fp_fusion=hc.NORM_FP_FUSION)
    yield Case("hc gates", hc._hc_gates, dict(DTYPE=act, BLOCK=512, INTERP=False), 4)
    yield Case("hc mix", hc._hc_mix, dict(HC=4, DTYPE=act, BLOCK=hc.MIX_BLOCK, INTERP=False), 4)
    yield Case("gdn gates", gdn_gates._gdn_gates, dict(B_DTYPE=act, BLOCK=32, INTERP=False), 1,
               ptrs={"alog_ptr": f32, "g_ptr": f32})
    for dil, hist in ((1, 3), (3, 9)):
        yield Case(f"conv update dilation {dil}", causal_conv._conv_update, dict(
                   TAPS=4, DIL=dil, S=hist, SP=triton.next_power_of_2(hist + 1), HAS_BIAS=False, HAS_INIT=True,
                   SILU=True, X_DTYPE=act, POOL_DTYPE=act, BLOCK=causal_conv.CONV_BLOCK, INTERP=False), 4,
                   ptrs={"idx_ptr": i64, "init_ptr": "u8"}, fp_fusion=causal_conv.CONV_FP_FUSION)
    yield Case("gated norm", gated_norm._gated_rms_norm, dict(SIGMOID=False, DTYPE=act, BLOCK=128, INTERP=False),
               norm.norm_warps(128))
    yield Case("shared gate", shared_gate._append_shared, dict(K=10, K_PAD=16, DTYPE=act, BLOCK_H=2048, INTERP=False),
               4, ptrs={"ids_ptr": i32, "w_ptr": f32, "ids_out_ptr": i32, "w_out_ptr": f32})
    yield Case("qsa block scores", qsa._block_scores, dict(HI_PAD=16, DI_PAD=128, BLOCK=qsa.BLOCK_B, INTERP=False), 4,
               ptrs={"pt_ptr": i32, "rows_ptr": i64, "vis_ptr": i64, "out_ptr": f32})
    yield Case("qsa selected page table", qsa._selected_table, dict(BLOCK_K=512), 4,
               ptrs={"blocks_ptr": i64, "pos_ptr": i64, "rows_ptr": i64, "pt_ptr": i32, "table_ptr": i32,
                     "len_ptr": i32})


def slot_plan_cases() -> Iterator[Case]:
    """The device expert cache's fused plan (dtype-free: int state), at the sizes the
    dispatcher allows: Qwen3.8-Flash-Next's 512 experts and up to MAX_SLOTS slots."""
    ptrs = {"ids_ptr": "i32", "dead_ptr": "u8", "pinned_ptr": "i1", "map_ptr": "i32", "owners_ptr": "i64", "recency_ptr": "i64",
            "clock_ptr": "i64", "counts_ptr": "i64", "events_ptr": "u8", "wave_end_ptr": "i64", "slot_ids_ptr": "i32",
            "hits_ptr": "u8", "misses_ptr": "i32", "overflow_ptr": "u8"}
    for experts, slots in ((128, 64), (512, 8192), (4096, 16384)):
        consts = dict(BLOCK_E=experts, BLOCK_S=slots, BLOCK_M=min(experts, slots), BLOCK_N=slot_plan.BLOCK_N,
                      HAS_PINNED=True, HAS_DEAD=True, MARK=True, SCAN=True, AHEAD=False, IN_REGISTERS=False)
        yield Case(f"slot plan E={experts} S={slots}", slot_plan._plan_wave, consts,
                   slot_plan.num_warps_for(slots), ptrs=ptrs)
        pairs = min(slot_plan.BLOCK_N, slot_plan.REGISTER_COMPARES // experts)  # a decode wave's most
        if pairs >= 16:
            yield Case(f"slot plan E={experts} S={slots} in registers", slot_plan._plan_wave,
                       {**consts, "BLOCK_N": pairs, "IN_REGISTERS": True}, slot_plan.num_warps_for(slots), ptrs=ptrs)


# Quantised expert banks: (FMT code, GROUP, data, scale, zero pointer types) per format.
PDL_MIN_ARCH = 90  # griddepcontrol: Hopper and later
PDL_PTX = ("griddepcontrol.wait", "griddepcontrol.launch_dependents")


def has_pdl(case: Case) -> bool:
    return any(p.name == "USE_PDL" for p in case.kernel.params)


def compile_case(case: Case, arch: int, dtype_name: str, pdl: bool = False) -> tuple[int, str, str]:
    """Compiles one kernel (USE_PDL = `pdl` where it has the switch); returns its shared
    memory in bytes, its PTX and its TTGIR."""
    params = {p.name: p for p in case.kernel.params}
    consts = {**case.consts, "USE_PDL": pdl} if "USE_PDL" in params else case.consts
    sig: dict[str, str] = {}
    for name, p in params.items():
        if p.is_constexpr:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + case.ptrs.get(name, dtype_name)
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    # A launch marks aligned pointers and ints divisible by 16 (`tt.divisibility`); with the
    # marks, Triton's pipeliner turns loads into async copies through shared memory, so
    # every argument gets one here: the shared memory of a real launch, at its largest.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(params) if sig[name] not in ("constexpr", "fp32")}
    src = ASTSource(case.kernel, sig, consts, attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": case.warps, "num_stages": case.stages, "launch_pdl": pdl,
                                       "enable_fp_fusion": case.fp_fusion})
    return int(compiled.metadata.shared), compiled.asm["ptx"], compiled.asm["ttgir"]


MEMORY_OPS = ("ld.", "st.", "atom.", "red.", "cp.", "prefetch.", "multimem.")
NOT_GLOBAL = (".param", ".shared", ".local", ".const")


def first_global_access(lines: list[str]) -> int:
    """Index of the PTX's first load, store, atomic or async copy that may touch global
    memory (any state space but param, shared, local, const), or len(lines)."""
    for i, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0].startswith("@"):  # a predicate guard
            tokens = tokens[1:]
        op = tokens[0] if tokens else ""
        if op.startswith(MEMORY_OPS) and not any(space in op for space in NOT_GLOBAL):
            return i
    return len(lines)


def pdl_ptx_ok(ptx: str, pdl: bool) -> bool:
    """With the switch on: both griddepcontrol instructions, the wait before every global
    memory access (in the PTX's text order: the wait sits in the entry block); off: none."""
    if not pdl:
        return "griddepcontrol" not in ptx
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    return all(op in ptx for op in PDL_PTX) and bool(waits) and waits[0] < first_global_access(lines)


def check(case: Case, arch: int, dtype_name: str, pdl: bool) -> bool:
    """Compiles and checks one kernel, printing one line."""
    try:
        shared, ptx, _ = compile_case(case, arch, dtype_name, pdl)
    except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
        print(f"FAIL sm_{arch} {dtype_name} {case.name}: {type(exc).__name__}: {exc}")
        return False
    ok_shared, ok_pdl = shared <= SHARED_LIMIT[arch], pdl_ptx_ok(ptx, pdl)
    tag = f", USE_PDL={pdl}: {'ok' if ok_pdl else 'wrong griddepcontrol'}" if has_pdl(case) else ""
    print(f"{'ok  ' if ok_shared and ok_pdl else 'FAIL'} sm_{arch} {dtype_name} {case.name}: {shared} B shared{tag}")
    return ok_shared and ok_pdl


def reductions(ttgir: str) -> list[str]:
    """Each `tt.reduce`'s axis and operand type, layouts spelled out, in program order: a
    compiled reduction's fp32 order is a function of exactly these (and of its combiner)."""
    aliases = dict(re.findall(r"^(#[\w.]+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    found = re.findall(r'"tt\.reduce"\(%[\w.]+\) <\{axis = (\d+)[^\n]*\n(?:.*\n)*?\s*\}\) : \((tensor<.*?>)\)', ttgir)
    spelled = []
    for axis, operand in found:
        for alias in sorted(aliases, key=len, reverse=True):  # #blocked10 before #blocked1
            operand = operand.replace(alias, aliases[alias])
        spelled.append(f"axis {axis}: {operand}")
    return spelled


def check_router_norm(act: tl.dtype, dtype_name: str, arch: int) -> bool:
    """The router fused with the add + RMSNorm (Qwen3-30B-A3B's H = 2048, and 4096) reduces
    as the two launches it replaces: first the sum of squares with `_rms_norm`'s operand
    layout, then every reduction of the plain fused router's, in its layouts. Same
    orders, so the same bits: h and x are `add_rms_norm`'s, the logits and routing the
    plain router's from that x."""
    ok = True
    for H in (2048, 4096):
        for offset in (False, True):
            block = triton.next_power_of_2(H)
            norm_case = Case("add rms norm", norm._rms_norm, dict(HAS_RES=True, OFFSET=offset, DTYPE=act, BLOCK=block,
                             INTERP=False), norm.norm_warps(block))
            want = [reductions(compile_case(c, arch, dtype_name)[2])
                    for c in (norm_case, fused_router_case(act, 128, H, None, "plain"))]
            got = reductions(compile_case(fused_router_case(act, 128, H, offset, "fused"), arch, dtype_name)[2])
            same = len(want[0]) == 1 and got == want[0] + want[1]
            print(f"{'ok  ' if same else 'FAIL'} sm_{arch} {dtype_name} add {'offset ' if offset else ''}rms norm + "
                  f"router H={H}: {len(got)} reductions {'as' if same else 'NOT as'} _rms_norm's + the plain router's")
            ok &= same
    return ok


def work_items(args: argparse.Namespace) -> list[Callable[[], bool]]:
    """Every check the arguments ask for, in the order its lines are printed."""
    items: list[Callable[[], bool]] = []
    for dtype_name in args.dtype:
        for case in cases(DTYPES[dtype_name]):
            if args.pdl and not has_pdl(case):
                continue
            low = max(case.min_arch, PDL_MIN_ARCH) if args.pdl else case.min_arch
            for arch in (a for a in args.arch if a >= low):
                items.append(functools.partial(check, case, arch, dtype_name, args.pdl))
        if not args.pdl:
            for arch in args.arch:
                items.append(functools.partial(check_router_norm, DTYPES[dtype_name], dtype_name, arch))
    return items


def run_share(argv: list[str] | None, worker: int, jobs: int) -> list[tuple[int, str, bool]]:
    """Runs every `jobs`-th item from `worker` on (the list rebuilt here: in a forked
    process nothing is pickled but the arguments); (index, printed lines, passed) each."""
    args = parse(argv)
    done = []
    for i, item in enumerate(work_items(args)):
        if i % jobs == worker:
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                ok = item()
            done.append((i, text.getvalue(), ok))
    return done


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 86, 89, 90], choices=sorted(SHARED_LIMIT))
    ap.add_argument("--dtype", nargs="+", default=["bf16"], choices=sorted(DTYPES))
    ap.add_argument("--pdl", action="store_true", help="only the kernels with USE_PDL, compiled with it True (sm_90+)")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else os.cpu_count() or 1,
                    help="processes compiling at once (each kernel compiles on one core; default: every CPU)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    jobs = max(1, min(args.jobs, len(work_items(args)) or 1))
    if jobs == 1:
        results = run_share(argv, 0, 1)
    else:  # forked: the cases' kernels are built in each process, never pickled
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            shares = pool.starmap(run_share, [(argv, w, jobs) for w in range(jobs)])
        results = sorted(r for share in shares for r in share)
    for _, text, _ in results:
        print(text, end="")
    failures = sum(not ok for _, _, ok in results)
    if not results:  # e.g. --pdl without an sm_90+ arch: a check that checked nothing must not pass
        print("FAIL nothing compiled")
        failures += 1
    print(f"{failures} failure(s); torch {torch.__version__}, triton {triton.__version__}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
