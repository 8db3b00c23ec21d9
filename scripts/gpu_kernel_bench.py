"""Time each Triton kernel of edgemoe.kernels on the GPU at Qwen3-30B-A3B shapes (bf16).

Decode shapes (batch 1, 8, 32) run inside one CUDA graph per case, rotating through
copies of the inputs so the working set exceeds L2 (a decode step reads weights and KV
from HBM, not from cache); prefill shapes (8K tokens) run eagerly through
triton.testing.do_bench. Prints time, achieved GB/s (and its share of 4.2 TB/s) and
TFLOP/s; writes JSON to $OUT/gpu_kernel_bench.json (else bench/results/).
Run from the repository root: PYTHONPATH=/tmp/site:src python3 scripts/gpu_kernel_bench.py
(/tmp/site: the carried wheels, msgspec among them; see docs/gpu.md). `--only SECTION ...`
runs some sections: `--only moe_splits` is the split-K sweep of moe_decode alone (T = 1,
8, 32 x gu_splits S = 1, 2, 4, 8 at the default row/col tiles; the whole call, then its
gate/up and down launches apart; well under a minute); `--only attention_sweep` times
decode attention at each candidate tile set (ATTN_SWEEP x ATTN_SWEEP_CASES, each checked
against the torch reference first; ~2 minutes, mostly compiling); `--only moe_q_sweep` the tile
sweep of the quantised decode GEMV (fp8, int4, mxfp4, int8 at T = 1, 8, 32 against bf16's
default; each configuration checked against the reference first; ~2-3 minutes, most of
it compiling); `--only moe_sweep` the same for the bf16 decode GEMV (BF16_SWEEP: stages,
wider steps, other row counts; ~1 minute).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.testing

from edgemoe.bench.cuda_timing import graph_us
from edgemoe.kernels.moe_experts import moe_combine
from edgemoe.kernels.moe_fused import moe_decode, moe_prefill, moe_slots_ref
from edgemoe.kernels.norm_fused import add_rms_norm
from edgemoe.kernels.paged_attention import decode_attention, decode_attention_ref, extend_attention
from edgemoe.kernels.rope_kv import rope_write_kv
from edgemoe.kernels.router import RouterWorkspace, add_norm_route, route_logits_topk, route_topk
from edgemoe.kernels.triton_ops import router as router_kernels
from edgemoe.layers.norm import RMSNorm
from edgemoe.quant import ExpertFormat

HBM_BYTES_S, BF16_FLOP_S = 4.2e12, 989e12  # H200: measured device copy bound; dense bf16 peak
H, I, E, K, HQ, HKV, D, PAGE = 2048, 768, 128, 8, 32, 4, 128, 16
# The MoE sweeps' expert shape, "H,I,E,K" (e.g. gpt-oss-20b's "2880,2880,32,4"); Qwen3-30B-A3B's by default.
H, I, E, K = (int(v) for v in os.environ.get("BENCH_MOE_SHAPE", f"{H},{I},{E},{K}").split(","))
# The decode attention sweep's heads, "HQ,HKV,D[,shared]" (GLM-4.7-Flash's latent cache: "20,1,576,shared",
# the value the key's own tensor as `KVPool(shared_kv=True)` holds it); Qwen3-30B-A3B's by default.
_ATTN = os.environ.get("BENCH_ATTN_SHAPE", f"{HQ},{HKV},{D}").split(",")
HQ, HKV, D, SHARED_KV = int(_ATTN[0]), int(_ATTN[1]), int(_ATTN[2]), _ATTN[3:] == ["shared"]
BF16, DEV = torch.bfloat16, "cuda"
L2_BYTES = 64 << 20
DECODE_TOKENS, PREFILL_TOKENS = (1, 8, 32), 8192
GU_SPLITS = (1, 2, 4, 8)  # moe_decode split-K sweep
# moe_q_sweep: (rows, cols, warps, stages) of both launches per format, after the format's
# default tiles (moe_gemv_q_tiles.DEFAULTS); cols count weights (a step's bytes: cols x bits / 8).
# Q_INPUTS routings rotate, so a round reads ~16 x 8 of the 128 experts: past L2, as a step.
Q_INPUTS = 16
Q_SWEEP = {
    "fp8": ((16, 128, 4, 1), (16, 512, 4, 1), (8, 256, 4, 1), (32, 256, 4, 1), (16, 256, 2, 1), (16, 256, 8, 1),
            (16, 256, 4, 2), (16, 256, 4, 3), (8, 512, 4, 2)),
    "int4": ((16, 256, 4, 1), (16, 1024, 4, 1), (8, 512, 4, 1), (32, 512, 8, 1), (16, 512, 8, 1), (16, 512, 2, 1),
             (16, 512, 4, 2), (16, 256, 4, 3), (8, 256, 4, 2)),
    "mxfp4": ((16, 512, 4, 1), (16, 256, 4, 1), (8, 512, 4, 1), (8, 1024, 4, 1), (16, 1024, 8, 1)),
    "int8": ((16, 128, 4, 1), (16, 512, 4, 1), (8, 256, 4, 1), (32, 256, 4, 1), (16, 256, 8, 1), (16, 256, 4, 2),
             (16, 256, 4, 3)),
}
# moe_sweep: (rows, cols, warps, stages) of both launches of the bf16 decode GEMV
# (EDGEMOE_MOE_GEMV_TILES, no split), after its default tiles (moe_gemv_tiles.DEFAULT):
# software pipelining at the tuned 16 x 128 tile, wider steps (more bytes in flight a
# program), fewer rows (more programs at T = 1: 8 pairs x I / 8 = 768 gate/up programs).
BF16_SWEEP = ((16, 128, 4, 2), (16, 128, 4, 3), (16, 256, 4, 1), (16, 256, 4, 2), (8, 128, 4, 1), (8, 256, 4, 1),
              (8, 256, 4, 3), (32, 128, 8, 1), (16, 128, 2, 1), (16, 128, 8, 2))
DECODE_ATTN = ((1, 1024), (1, 32768), (8, 4096), (32, 4096))  # (batch, context)
EXTEND_ATTN = ((0, 8192), (6144, 2048))  # (cached prefix, new tokens)
ATTN_SWEEP_CASES = ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 4096))  # (batch, context)
# EDGEMOE_ATTN_DECODE_TILES candidates after the default: splits,block_n,warps,stages,merge_chunk,
# min_blocks,long_blocks,long_stages,wide_splits,wide_chunk. The old one-loop default; the
# pipelined loop from 2 blocks a split (8K); a plain loop at 1 stage (K/V straight to
# registers, no shared-memory hop); a 32-split wide chunk (4-warp merge); 128 splits of 32
# keys (its pipelined loop needs half the shared memory) with 1-block or 2-block splits.
ATTN_SWEEP = ("64,64,4,2,8,1,4,2,32,8", "64,64,4,2,8,1,2,5,32,64", "64,64,4,1,8,1,4,5,32,64",
              "64,64,4,2,8,1,4,5,32,32", "128,32,4,2,8,1,8,5,32,128", "128,32,4,2,8,2,8,5,32,128")
RESULTS: list[dict] = []


def swept(name: str, default: tuple, ints: bool = True) -> tuple:
    """A sweep's candidates: `SWEEP_<NAME>` (space-separated, each comma-separated) replaces
    `default` for a follow-up round without an edit (e.g. SWEEP_ATTN="128,32,4,5,128,4",
    SWEEP_BF16="16,512,4,1 8,64,4,1"; SWEEP_FORMATS="mxfp4 int4" picks moe_q_sweep's formats)."""
    raw = os.environ.get(f"SWEEP_{name.upper()}")
    if raw is None:
        return default
    items = raw.split()
    return tuple(tuple(int(v) for v in i.split(",")) for i in items) if ints else tuple(items)


def eager_us(call: Callable[[], object]) -> float:
    return triton.testing.do_bench(call, warmup=25, rep=200) * 1000


def record(kernel: str, case: str, us: float, nbytes: float, flops: float, mode: str) -> None:
    gbs, tfs = nbytes / us / 1e3, flops / us / 1e6
    row = dict(kernel=kernel, case=case, mode=mode, us=round(us, 2), GBps=round(gbs, 1),
               hbm_frac=round(nbytes / us / 1e-6 / HBM_BYTES_S, 3), TFLOPs=round(tfs, 2),
               flop_frac=round(flops / us / 1e-6 / BF16_FLOP_S, 3))
    RESULTS.append(row)
    print(f"{kernel:<18} {case:<26} {mode:<6} {us:9.1f} µs {gbs:8.0f} GB/s ({row['hbm_frac']:5.1%}) {tfs:7.1f} TFLOP/s",
          flush=True)


def copies_for(bytes_per_call: float, cap: int = 16) -> int:
    """Input copies to rotate through so one round reads more than L2 holds."""
    return max(2, min(cap, -(-4 * L2_BYTES // max(1, int(bytes_per_call)))))


def routing(tokens: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(tokens, E, generator=g, device=DEV).argsort(dim=1)[:, :K].to(torch.int32)
    w = torch.rand(tokens, K, generator=g, device=DEV)
    return ids, w / w.sum(1, keepdim=True)


def bench_moe(gate_up: torch.Tensor, down: torch.Tensor) -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    expert_bytes = 3 * H * I * 2
    for tokens in DECODE_TOKENS:
        n = 16
        xs = [torch.randn(tokens, H, generator=g, device=DEV).to(BF16) for _ in range(n)]
        routes = [routing(tokens, g) for _ in range(n)]
        cells = [torch.zeros(tokens, K, H, device=DEV) for _ in range(n)]
        ws = torch.empty(tokens * K * I, dtype=BF16, device=DEV)
        distinct = sum(torch.unique(r[0]).numel() for r in routes) / n
        nbytes = distinct * expert_bytes + tokens * H * 2 + tokens * K * H * 4
        flops = 2 * tokens * K * 3 * H * I
        for name, fn in (("moe_decode", moe_decode), ("moe_prefill", moe_prefill)):
            calls = [lambda i=i, fn=fn: fn(xs[i], routes[i][0], routes[i][1], gate_up, down, cells[i], "silu", ws)
                     for i in range(n)]
            record(name, f"T={tokens}", graph_us(calls, rounds=4), nbytes, flops, "graph")
        record("moe_combine+res", f"T={tokens}", graph_us([lambda i=i: moe_combine(cells[i], BF16, xs[i])
                                                          for i in range(n)], rounds=4),
               tokens * K * H * 4 + 2 * tokens * H * 2, 0, "graph")
        if tokens == 1:
            record("moe torch ref", "T=1", eager_us(lambda: moe_slots_ref(xs[0], routes[0][0], routes[0][1], gate_up,
                                                                          down, cells[0], "silu")), nbytes, flops,
                   "eager")
    tokens = PREFILL_TOKENS
    x = torch.randn(tokens, H, generator=g, device=DEV).to(BF16)
    ids, w = routing(tokens, g)
    cells8k = torch.zeros(tokens, K, H, device=DEV)
    nbytes = E * expert_bytes + tokens * H * 2 + tokens * K * (H * 4 + I * 4)
    record("moe_prefill", f"T={tokens}", eager_us(lambda: moe_prefill(x, ids, w, gate_up, down, cells8k, "silu")), nbytes,
           2 * tokens * K * 3 * H * I, "eager")
    record("moe_combine+res", f"T={tokens}", eager_us(lambda: moe_combine(cells8k, BF16, x)),
           tokens * K * H * 4 + 2 * tokens * H * 2, 0, "eager")


def bench_moe_splits(gate_up: torch.Tensor, down: torch.Tensor) -> None:
    """moe_decode with its gate/up launch split S ways (the 7th EDGEMOE_MOE_GEMV_TILES
    value), at the default row/col tiles: the whole call, then each launch alone (down
    re-derives the activation from the fp32 partials, so its time moves with S too).
    GB/s count the weights, x and cells only (the partials stay in L2)."""
    from edgemoe.kernels.moe_gemv_tiles import ENV, tiles
    from edgemoe.kernels.triton_ops.moe_gemv import decode_launch, down_launch, gate_up_launch

    g = torch.Generator(device=DEV).manual_seed(5)
    base, saved = ",".join(str(v) for v in tiles()[:6]), os.environ.get(ENV)
    for tokens in DECODE_TOKENS:
        n = 16
        xs = [torch.randn(tokens, H, generator=g, device=DEV).to(BF16) for _ in range(n)]
        routes = [routing(tokens, g) for _ in range(n)]
        cells = [torch.zeros(tokens, K, H, device=DEV) for _ in range(n)]
        distinct = sum(torch.unique(r[0]).numel() for r in routes) / n
        gu_bytes, down_bytes = distinct * 2 * H * I * 2 + tokens * H * 2, distinct * H * I * 2 + tokens * K * H * 4
        flops = 2 * tokens * K * 3 * H * I
        for splits in GU_SPLITS:
            os.environ[ENV] = f"{base},{splits}"
            try:
                ws = torch.empty(tokens * K * I * (2 * splits if splits > 1 else 1),
                                 dtype=torch.float32 if splits > 1 else BF16, device=DEV)
                launches = [decode_launch(xs[i], routes[i][0], routes[i][1], gate_up, down, cells[i], "silu", ws)
                            for i in range(n)]
                case = f"T={tokens} S={splits}"
                both = [lambda d=d: (gate_up_launch(d), down_launch(d)) for d in launches]
                record("moe_decode split", case, graph_us(both, rounds=4), gu_bytes + down_bytes, flops, "graph")
                record("moe_decode gate_up", case, graph_us([lambda d=d: gate_up_launch(d) for d in launches], rounds=4),
                       gu_bytes, 2 * flops / 3, "graph")
                record("moe_decode down", case, graph_us([lambda d=d: down_launch(d) for d in launches], rounds=4),
                       down_bytes, flops / 3, "graph")
            finally:
                if saved is None:
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = saved


class DecodeAttentionCase(NamedTuple):
    calls: list[Callable[[], object]]  # one decode_attention per input copy
    outs: list[torch.Tensor]
    ref: Callable[[], torch.Tensor]  # copy 0 through the fp32 torch reference
    kv_bytes: int
    flops: int


def decode_attention_case(batch: int, ctx: int, g: torch.Generator) -> DecodeAttentionCase:
    """`batch` sequences of `ctx` keys, pages scattered at random, in enough copies that
    one round of calls reads more than L2 holds."""
    kv_bytes = batch * ctx * HKV * D * 2 * (1 if SHARED_KV else 2)
    n = copies_for(kv_bytes)
    pages = ctx // PAGE
    k_pool = torch.randn(n * batch * ctx, HKV, D, generator=g, device=DEV).to(BF16)
    v_pool = k_pool if SHARED_KV else torch.randn(n * batch * ctx, HKV, D, generator=g, device=DEV).to(BF16)
    tables = [(torch.randperm(batch * pages, generator=g, device=DEV) + i * batch * pages).view(batch, pages)
              .to(torch.int32) for i in range(n)]
    rows = torch.arange(batch, dtype=torch.int32, device=DEV)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    qs = [torch.randn(batch, HQ, D, generator=g, device=DEV).to(BF16) for _ in range(n)]
    outs = [torch.empty_like(q) for q in qs]
    calls = [lambda i=i: decode_attention(qs[i], k_pool, v_pool, tables[i], rows, lens, PAGE, D**-0.5, None, outs[i])
             for i in range(n)]
    head = slice(0, batch * ctx)  # copy 0's slots: its table holds pages 0 .. batch * pages - 1
    ref = lambda: decode_attention_ref(qs[0].float(), k_pool[head].float(), v_pool[head].float(),  # noqa: E731
                                       tables[0], rows, lens, PAGE, D**-0.5, None, torch.empty(qs[0].shape, device=DEV))
    return DecodeAttentionCase(calls, outs, ref, kv_bytes, 4 * batch * HQ * D * ctx)


def bench_moe_q_sweep() -> None:
    """The quantised decode GEMV (moe_gemv_q) over tile configurations (Q_SWEEP, the format's
    default first; EDGEMOE_MOE_GEMV_Q_TILES_<FMT> set per configuration): fp8, int4 and int8
    banks of E experts at T = 1, 8, 32, the call then each launch timed apart, so the best
    gate/up and the best down configuration can be taken separately. bf16's default
    (moe_gemv) first, on the same routes: the baseline. Each configuration's output is
    checked against the reference before it is timed; a broken one is reported (a row with
    "error"), not timed. GB/s count the format's bytes of the distinct experts, x and cells."""
    gemv_sweep(("bf16", *swept("formats", tuple(Q_SWEEP), ints=False)), bf16_sweep=False)


def bench_moe_sweep() -> None:
    """moe_q_sweep's measurement for the bf16 decode GEMV (moe_gemv): its default tiles,
    then BF16_SWEEP (EDGEMOE_MOE_GEMV_TILES set per configuration), T = 1, 8, 32, each
    checked against the reference first; ends with the best gate/up and down configuration
    (geometric mean over T) and the override that adopts both."""
    gemv_sweep(("bf16",), bf16_sweep=True)


def sweep_env(fmt_name: str) -> str:
    """The tile override a sweep sets for a format (bf16: moe_gemv's)."""
    from edgemoe.kernels import moe_gemv_tiles
    from edgemoe.kernels.moe_gemv_q_tiles import env_name

    return moe_gemv_tiles.ENV if fmt_name == "bf16" else env_name(fmt_name)


def gemv_sweep(formats: tuple[str, ...], bf16_sweep: bool) -> None:
    """The decode GEMV sweeps' shared loop: each format's configurations (bf16: its default
    alone, the quantised formats' baseline, unless `bf16_sweep`) x T, checked then timed."""
    from edgemoe.kernels.moe_quant import moe_quant_ref
    from edgemoe.kernels.triton_ops import moe_gemv, moe_gemv_q

    g = torch.Generator(device=DEV).manual_seed(6)
    gate_up = (torch.randn(E, 2 * I, H, generator=g, device=DEV) * H**-0.5).to(BF16)
    down = (torch.randn(E, H, I, generator=g, device=DEV) * I**-0.5).to(BF16)
    inputs = {tokens: ([torch.randn(tokens, H, generator=g, device=DEV).to(BF16) for _ in range(Q_INPUTS)],
                       [routing(tokens, g) for _ in range(Q_INPUTS)]) for tokens in DECODE_TOKENS}
    times: dict[tuple[str, int, int], tuple[float, float, float]] = {}  # (format, config, T) → µs
    for fmt_name in formats:
        fmt, parts, configs, nbytes = q_sweep_banks(fmt_name, gate_up, down, bf16_sweep)
        for tokens, (xs, routes) in inputs.items():
            cells = [torch.zeros(tokens, K, H, device=DEV) for _ in xs]
            ws = torch.empty(tokens * K * I, dtype=BF16, device=DEV)
            want = torch.zeros(tokens, K, H, device=DEV)
            if fmt.quantised:
                moe_quant_ref(xs[0], *routes[0], parts, fmt, want, "silu")
            else:
                moe_slots_ref(xs[0], *routes[0], gate_up, down, want, "silu")
            distinct = sum(torch.unique(r[0]).numel() for r in routes) / len(routes)
            moved = (distinct * nbytes[0] + tokens * H * 2, distinct * nbytes[1] + tokens * K * H * 4)
            for n, (cfg, label) in enumerate(configs):
                if cfg is not None:
                    os.environ[sweep_env(fmt_name)] = ",".join(str(v) for v in cfg)
                make = functools.partial(q_launches, fmt, parts, xs, routes, cells, ws)
                fns = ((moe_gemv_q.gate_up_q_launch, moe_gemv_q.down_q_launch) if fmt.quantised
                       else (moe_gemv.gate_up_launch, moe_gemv.down_launch))
                try:
                    us = time_q_config(f"moe_q {fmt_name}", f"T={tokens} {label}", make, *fns, want, moved, tokens)
                finally:
                    os.environ.pop(sweep_env(fmt_name), None)
                if us is not None:
                    times[fmt_name, n, tokens] = us
        if len(configs) > 1:
            summarise_q_sweep(fmt_name, [c for c, _ in configs], times)
        del parts
        torch.cuda.empty_cache()


def summarise_q_sweep(fmt_name: str, configs: list, times: dict) -> None:
    """The configuration of each launch with the lowest geometric mean of µs over T = 1, 8,
    32 (tiles may not depend on T: one must serve all), among those that ran at every T;
    prints it against the default and bf16, and the override that adopts both winners
    (a "moe_q best" row in the JSON; for bf16 itself its default is the baseline)."""
    def geomean(fmt: str, n: int, launch: int) -> float:
        return math.prod(times[fmt, n, t][launch] for t in DECODE_TOKENS) ** (1 / len(DECODE_TOKENS))

    complete = [n for n in range(len(configs)) if all((fmt_name, n, t) in times for t in DECODE_TOKENS)]
    if not complete or not all(("bf16", 0, t) in times for t in DECODE_TOKENS):
        print(f"moe_q {fmt_name}: no configuration ran at every T", flush=True)
        return
    gu, dn = (min(complete, key=lambda n, i=i: geomean(fmt_name, n, i)) for i in (1, 2))
    # gate_up's configuration with down's fields (rows, cols, warps, stages) from the other
    # (MoeGemvQTiles and bf16's MoeGemvTiles name them alike)
    d = configs[dn]
    best = configs[gu]._replace(down_rows=d.down_rows, down_cols=d.down_cols, down_warps=d.down_warps,
                                down_stages=d.down_stages)
    env = f'{sweep_env(fmt_name)}="{",".join(str(v) for v in best)}"'
    for t in DECODE_TOKENS:
        bf16, default = sum(times["bf16", 0, t][1:]), sum(times[fmt_name, 0, t][1:]) if 0 in complete else math.nan
        won = times[fmt_name, gu, t][1] + times[fmt_name, dn, t][2]
        print(f"moe_q {fmt_name} T={t}: bf16 {bf16:.1f} µs, default {default:.1f}, best gate_up + down {won:.1f} "
              f"({won / bf16:.2f} of bf16)", flush=True)
    print(f"moe_q {fmt_name} best (geometric mean over T): gate_up config {gu}, down config {dn}: {env}", flush=True)
    RESULTS.append(dict(kernel="moe_q best", case=fmt_name, mode="summary", env=env, gate_up=gu, down=dn))


def q_launches(fmt: ExpertFormat, parts: dict, xs: list, routes: list, cells: list, ws: torch.Tensor) -> list:
    """One decode launch per input, with the tiles the environment holds now."""
    from edgemoe.kernels.triton_ops import moe_gemv, moe_gemv_q

    if fmt.quantised:
        return [moe_gemv_q.decode_q_launch(x, *r, parts, fmt, c, "silu", ws) for x, r, c in zip(xs, routes, cells,
                                                                                                 strict=True)]
    return [moe_gemv.decode_launch(x, *r, parts["gate_up"], parts["down"], c, "silu", ws)
            for x, r, c in zip(xs, routes, cells, strict=True)]


def q_sweep_banks(fmt_name: str, gate_up: torch.Tensor, down: torch.Tensor, bf16_sweep: bool = False) -> tuple:
    """(format, its banks of the bf16 experts, [(tiles, label)], (gate_up, down) bytes an
    expert); bf16: its default tiles alone, or with BF16_SWEEP's after them (`bf16_sweep`)."""
    from edgemoe.kernels import moe_gemv_tiles
    from edgemoe.kernels.moe_gemv_q_tiles import DEFAULTS
    from edgemoe.quant import expert_format, expert_specs, quantise_expert

    fmt = expert_format(fmt_name)
    specs = expert_specs(fmt, H, I)
    nbytes = [sum(math.prod(shape) * dt.itemsize for name, (shape, dt) in specs.items() if name.startswith(proj))
              for proj in ("gate_up", "down")]
    if not fmt.quantised and not bf16_sweep:
        return fmt, {"gate_up": gate_up, "down": down}, [(None, "default")], nbytes
    if fmt.quantised:
        experts = [quantise_expert(fmt, gate_up[e, :I], gate_up[e, I:], down[e]) for e in range(E)]
        parts = {name: torch.stack([x[name] for x in experts]) for name in experts[0]}
        default = DEFAULTS[fmt_name]
        tiles = [default, *(default._make((*c[:3], *c[:3], c[3], c[3])) for c in swept(fmt_name, Q_SWEEP.get(fmt_name, ())))]
    else:  # no split (S = 1): the sweep's swept S already (moe_splits)
        parts, default = {"gate_up": gate_up, "down": down}, moe_gemv_tiles.DEFAULT
        tiles = [default, *(default._make((*c[:3], *c[:3], 1, c[3], c[3])) for c in swept("bf16", BF16_SWEEP))]
    labels = [f"{t.gu_rows}x{t.gu_cols} w{t.gu_warps} s{t.gu_stages} | {t.down_rows}x{t.down_cols} w{t.down_warps} "
              f"s{t.down_stages}" + (" default" if t == default else "") for t in tiles]
    return fmt, parts, list(zip(tiles, labels, strict=True)), nbytes


def time_q_config(kernel: str, case: str, make: Callable[[], list], gate_up_fn: Callable, down_fn: Callable,
                  want: torch.Tensor, nbytes: tuple[float, float], tokens: int) -> tuple[float, float, float] | None:
    """One configuration of moe_q_sweep: its launches built and checked on the first input
    against the reference (bf16's rounding chain: 6 ulps of the row's largest cell, as
    tests/gpu/test_moe_quant_gpu.py), then the call and each launch timed in CUDA graphs."""
    try:
        launches = make()
        d = launches[0]
        d.cells.zero_()
        gate_up_fn(d)
        down_fn(d)
        torch.cuda.synchronize()
        err = ((d.cells - want).abs() - 6 * 2**-7 * want.abs().amax(dim=-1, keepdim=True)).amax().item()
        error = None if err <= 0 else f"off the reference by {err:.3g} past the bound"
    except Exception as exc:  # noqa: BLE001 - a configuration that fails to compile or run is reported
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
    if error is not None:
        RESULTS.append(dict(kernel=kernel, case=case, mode="check", error=error))
        print(f"{kernel:<18} {case:<26} BROKEN: {error}", flush=True)
        return None
    flops = 2 * tokens * K * 3 * H * I
    us = (graph_us([lambda d=d: (gate_up_fn(d), down_fn(d)) for d in launches], rounds=4),
          graph_us([lambda d=d: gate_up_fn(d) for d in launches], rounds=4),
          graph_us([lambda d=d: down_fn(d) for d in launches], rounds=4))
    record(kernel, case, us[0], sum(nbytes), flops, "graph")
    record(kernel + " gate_up", case, us[1], nbytes[0], 2 * flops / 3, "graph")
    record(kernel + " down", case, us[2], nbytes[1], flops / 3, "graph")
    return us


def bench_decode_attention() -> None:
    g = torch.Generator(device=DEV).manual_seed(1)
    for batch, ctx in DECODE_ATTN:
        case = decode_attention_case(batch, ctx, g)
        record("decode_attention", f"B={batch} ctx={ctx}", graph_us(case.calls, rounds=4), case.kv_bytes, case.flops,
               "graph")
        del case


def bench_attention_sweep() -> None:
    """decode_attention at each ATTN_SWEEP tile set (EDGEMOE_ATTN_DECODE_TILES), today's
    first, at ATTN_SWEEP_CASES. Each set's output of copy 0 is checked against the fp32
    torch reference first; a set outside the bound is reported (a row with mode "wrong"
    and its error), not timed. Bound: 2^-7 of the reference's largest element. The output's
    bf16 rounding (2^-9 relative) and the probabilities' (2^-9 each, random signs) keep a
    correct set at ~0.3-0.4 of it on this random data (a torch emulation of the kernel's
    roundings at 1K-128K); one lost split of 64-256 is 8-40x over it.
    NOTE: the override is restored afterwards (read per call: nothing else sees it)."""
    from edgemoe.kernels.attn_decode_tiles import ENV

    g = torch.Generator(device=DEV).manual_seed(6)
    saved = os.environ.get(ENV)
    for batch, ctx in ATTN_SWEEP_CASES:
        case = decode_attention_case(batch, ctx, g)
        want = case.ref()
        bound = 2**-7 * want.abs().max().item()
        for tiles in attn_sweep():
            os.environ[ENV] = tiles
            try:
                label = f"B={batch} ctx={ctx} {tiles}"
                case.calls[0]()
                err = (case.outs[0].float() - want).abs().max().item()
                if not err <= bound:  # NaN too
                    RESULTS.append(dict(kernel="decode_attention tiles", case=label, mode="wrong", err=err, bound=bound))
                    print(f"decode_attention tiles {label}: WRONG, max err {err:.3g} > {bound:.3g}", flush=True)
                    continue
                record("decode_attention tiles", label, graph_us(case.calls, rounds=4), case.kv_bytes, case.flops,
                       "graph")
            finally:
                if saved is None:
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = saved
        del case, want
    print_sweep_summary()


def attn_sweep() -> tuple[str, ...]:
    """The default tiles first (the summary's baseline), then ATTN_SWEEP or SWEEP_ATTN's sets."""
    from edgemoe.kernels.attn_decode_tiles import DEFAULT

    today = ",".join(str(v) for v in DEFAULT)
    return (today, *(t for t in swept("attn", ATTN_SWEEP, ints=False) if t != today))


def print_sweep_summary() -> None:
    """Per case, today's tiles (attn_sweep()[0]) and the fastest set; then the set with the
    best geometric mean over the cases (each set timed at every case)."""
    rows = [r for r in RESULTS if r["kernel"] == "decode_attention tiles" and r["mode"] == "graph"]
    us = {(r["case"].rsplit(" ", 1)[0], r["case"].rsplit(" ", 1)[1]): r["us"] for r in rows}
    cases = sorted({c for c, _ in us}, key=[f"B={b} ctx={n}" for b, n in ATTN_SWEEP_CASES].index)
    for case in cases:
        best = min((t for c, t in us if c == case), key=lambda t: us[case, t])
        print(f"sweep {case}: today {us.get((case, attn_sweep()[0]), float('nan')):.2f} µs, "
              f"best {best} {us[case, best]:.2f} µs", flush=True)
    whole = [t for t in attn_sweep() if all((c, t) in us for c in cases)]
    if cases and whole:
        mean = {t: math.prod(us[c, t] for c in cases) ** (1 / len(cases)) for t in whole}
        best = min(whole, key=mean.get)
        print(f"sweep overall (geometric mean over {len(cases)} cases): best {best} {mean[best]:.2f} µs, "
              f"today {mean.get(attn_sweep()[0], float('nan')):.2f} µs", flush=True)


def bench_extend_attention() -> None:
    g = torch.Generator(device=DEV).manual_seed(2)
    for prefix, chunk in EXTEND_ATTN:
        ctx = prefix + chunk
        pages = ctx // PAGE
        k = torch.randn(ctx, HKV, D, generator=g, device=DEV).to(BF16)
        v = torch.randn(ctx, HKV, D, generator=g, device=DEV).to(BF16)
        table = torch.randperm(pages, generator=g, device=DEV).to(torch.int32)[None]
        q = torch.randn(chunk, HQ, D, generator=g, device=DEV).to(BF16)
        rows = torch.zeros(1, dtype=torch.int32, device=DEV)
        cu = torch.tensor([0, chunk], dtype=torch.int32, device=DEV)
        lens = torch.tensor([ctx], dtype=torch.int32, device=DEV)
        us = eager_us(lambda: extend_attention(q, k, v, table, rows, cu, lens, PAGE, D**-0.5, None, chunk))
        causal_pairs = chunk * prefix + chunk * (chunk + 1) / 2
        record("extend_attention", f"prefix={prefix} new={chunk}", us, (2 * ctx * HKV + 2 * chunk * HQ) * D * 2,
               4 * HQ * D * causal_pairs, "eager")


def bench_small_ops() -> None:
    g = torch.Generator(device=DEV).manual_seed(3)
    weight = torch.randn(H, generator=g, device=DEV).to(BF16)
    max_pos = 32768
    freqs = torch.arange(max_pos, device=DEV).float()[:, None] * torch.rand(D // 2, generator=g, device=DEV)
    cos, sin = freqs.cos(), freqs.sin()
    k_cache = torch.zeros(max_pos, HKV, D, dtype=BF16, device=DEV)
    v_cache = torch.zeros_like(k_cache)
    for tokens in (*DECODE_TOKENS, PREFILL_TOKENS):
        prefill = tokens == PREFILL_TOKENS
        n = 1 if prefill else 16
        xs = [torch.randn(tokens, H, generator=g, device=DEV).to(BF16) for _ in range(2 * n)]
        norm_calls = [lambda i=i: add_rms_norm(xs[2 * i], xs[2 * i + 1], weight, 1e-6) for i in range(n)]
        qkv = [[torch.randn(tokens, h, D, generator=g, device=DEV).to(BF16) for h in (HQ, HKV, HKV)] for _ in range(n)]
        pos = torch.randint(0, max_pos, (tokens,), generator=g, device=DEV)
        loc = torch.randperm(max_pos, generator=g, device=DEV)[:tokens]
        rope_calls = [lambda i=i: rope_write_kv(*qkv[i], pos, cos, sin, k_cache, v_cache, loc) for i in range(n)]
        # Qwen3's q/k head norms fused in (replacing two rms_norm launches per layer)
        normed_calls = [lambda i=i: rope_write_kv(*qkv[i], pos, cos, sin, k_cache, v_cache, loc, None, None,
                                                  weight[:D], weight[D : 2 * D], 1e-6) for i in range(n)]
        mode = "eager" if prefill else "graph"
        timer = (lambda calls: eager_us(calls[0])) if prefill else (lambda calls: graph_us(calls, rounds=4))
        record("add_rms_norm", f"T={tokens}", timer(norm_calls), 4 * tokens * H * 2, 0, mode)
        record("rope_write_kv", f"T={tokens}", timer(rope_calls), 2 * tokens * (HQ + 2 * HKV) * D * 2, 0, mode)
        record("rope_write_kv+qk_norm", f"T={tokens}", timer(normed_calls), 2 * tokens * (HQ + 2 * HKV) * D * 2, 0,
               mode)


def bench_router() -> None:
    """The router at Qwen3-30B-A3B's shape (E = 128 x H = 2048, top-8): cuBLAS then the top-k
    kernel (today's path), then the fused launch at its default tiles and a small sweep
    (BLOCK_E experts per program, warps; the top-k by ranks, and by the K rounds of search
    it replaced: `-search`); one weight per call, rotated past L2 as a step's 48 layers are.
    NOTE: the sweep sets the kernel module's constants, restored afterwards."""
    g = torch.Generator(device=DEV).manual_seed(4)
    n = copies_for(E * H * 2, cap=128)
    weights = [(torch.randn(E, H, generator=g, device=DEV) * H**-0.5).to(BF16) for _ in range(n)]
    ws = RouterWorkspace.allocate(E, torch.device(DEV))
    default = (router_kernels.BLOCK_E, router_kernels.NUM_WARPS, router_kernels.RANK_MAX_E_PAD)
    for tokens in DECODE_TOKENS:
        x = torch.randn(tokens, H, generator=g, device=DEV).to(BF16)
        nbytes = E * H * 2 + tokens * H * 2
        unfused = [lambda w=w, x=x: route_topk(F.linear(x, w), K, True, BF16) for w in weights]
        record("router cuBLAS+topk", f"T={tokens}", graph_us(unfused, rounds=4), nbytes, 0, "graph")
        fused = [lambda w=w, x=x: route_logits_topk(x, w, K, True, BF16, ws) for w in weights]
        record("router fused", f"T={tokens} default", graph_us(fused, rounds=4), nbytes, 0, "graph")
        bench_router_norm(tokens, weights, ws, g)
        for block_e, warps in ((2, 2), (2, 4), (2, 8), (4, 8), (8, 8)):
            for ranks in (True, False):
                router_kernels.BLOCK_E, router_kernels.NUM_WARPS = block_e, warps
                router_kernels.RANK_MAX_E_PAD = default[2] if ranks else 0
                try:
                    case = f"T={tokens} e{block_e}w{warps}{'' if ranks else '-search'}"
                    record("router fused", case, graph_us(fused, rounds=4), nbytes, 0, "graph")
                finally:
                    router_kernels.BLOCK_E, router_kernels.NUM_WARPS, router_kernels.RANK_MAX_E_PAD = default


def bench_router_norm(tokens: int, weights: list[torch.Tensor], ws: RouterWorkspace, g: torch.Generator) -> None:
    """The layer's residual add + RMSNorm and its router: `add_rms_norm` then the fused
    router (two launches, EDGEMOE_ROUTER_NORM=0) against `add_norm_route`'s one launch."""
    a, residual = (torch.randn(tokens, H, generator=g, device=DEV).to(BF16) for _ in range(2))
    norm = RMSNorm((torch.randn(H, generator=g, device=DEV) * 0.3 + 1).to(BF16), 1e-6)
    nbytes = E * H * 2 + 4 * tokens * H * 2 + H * 2  # the weight; a and residual in, x and h out; the norm's
    pair = [lambda w=w: route_logits_topk(norm.add_and_norm(a, residual)[0], w, K, True, BF16, ws) for w in weights]
    record("add_rms_norm + router fused", f"T={tokens}", graph_us(pair, rounds=4), nbytes, 0, "graph")
    one = [lambda w=w: add_norm_route(a, residual, norm, w, K, True, BF16, ws) for w in weights]
    record("router fused + add_rms_norm", f"T={tokens}", graph_us(one, rounds=4), nbytes, 0, "graph")


SECTIONS = ("moe", "moe_splits", "attention", "attention_sweep", "small", "router", "moe_q_sweep", "moe_sweep")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if not s.endswith("_sweep"))  # tuning sweeps: asked for by name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(DEFAULT_SECTIONS),
                    help="sections to run (default: all but the *_sweep tunings)")
    only = set(ap.parse_args().only)
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    t0 = time.time()
    if only & {"moe", "moe_splits"}:
        g = torch.Generator(device=DEV).manual_seed(42)
        gate_up = (torch.randn(E, 2 * I, H, generator=g, device=DEV) * H**-0.5).to(BF16)
        down = (torch.randn(E, H, I, generator=g, device=DEV) * I**-0.5).to(BF16)
        if "moe" in only:
            bench_moe(gate_up, down)
        if "moe_splits" in only:
            bench_moe_splits(gate_up, down)
        del gate_up, down
        torch.cuda.empty_cache()
    if "attention" in only:
        bench_decode_attention()
        bench_extend_attention()
    if "attention_sweep" in only:
        bench_attention_sweep()
    if "small" in only:
        bench_small_ops()
    if "router" in only:
        bench_router()
    if "moe_q_sweep" in only:
        bench_moe_q_sweep()
    if "moe_sweep" in only:
        bench_moe_sweep()
    out_dir = Path(os.environ.get("OUT") or "bench/results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_kernel_bench.json"
    meta = dict(device=props.name, torch=torch.__version__, triton=triton.__version__, hbm_bytes_s=HBM_BYTES_S,
                sections=sorted(only), seconds=round(time.time() - t0, 1))
    path.write_text(json.dumps(dict(meta=meta, results=RESULTS), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
