"""`edgemoe bench moe-quant`: the fused MoE kernels over quantised slot banks on the GPU.

Decode (batch 1 and 4, top-8 of `--slots` experts at the Qwen3-30B-A3B shape): GB/s of
the format's weight bytes the step reads (the figure the decode bound uses), beside the
bf16 kernel; prefill (a chunk of `--prefill-tokens` tokens): TFLOP/s of the grouped GEMM,
weight-only dequantisation and, for fp8 on sm_89+, the fp8 tensor-core path. Times are
CUDA events over repeated launches, JSON + PNG under bench/results/.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch

from edgemoe.bench.inputs import moe_batch
from edgemoe.bench.results import plot_bars, write_result
from edgemoe.kernels.moe_fused import moe_decode, moe_prefill
from edgemoe.kernels.moe_quant import moe_decode_quant, moe_prefill_quant
from edgemoe.quant import expert_format, expert_nbytes, quantise_expert

FORMATS = ("bf16", "fp8", "int8", "int4", "mxfp4")


def _time(fn: Callable[[], None], reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def _banks(fmt_name: str, hidden: int, inter: int, slots: int) -> dict[str, torch.Tensor]:
    fmt = expert_format(fmt_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    experts = []
    for _ in range(slots):
        gu = torch.randn(2 * inter, hidden, generator=g, device="cuda") * hidden**-0.5
        dn = torch.randn(hidden, inter, generator=g, device="cuda") * inter**-0.5
        experts.append(quantise_expert(fmt, gu[:inter], gu[inter:], dn) if fmt.quantised
                       else {"gate_up": gu.bfloat16(), "down": dn.bfloat16()})
    return {n: torch.stack([e[n] for e in experts]) for n in experts[0]}


def _decode_call(fmt: Any, b: Any, parts: dict[str, torch.Tensor], cells: torch.Tensor) -> Callable[[], None]:
    if fmt.quantised:
        return lambda: moe_decode_quant(b.x, b.slot_ids, b.weights, parts, fmt, cells, "silu")
    return lambda: moe_decode(b.x, b.slot_ids, b.weights, parts["gate_up"], parts["down"], cells, "silu")


def _prefill_call(fmt: Any, b: Any, parts: dict[str, torch.Tensor], cells: torch.Tensor) -> Callable[[], None]:
    if fmt.quantised:
        return lambda: moe_prefill_quant(b.x, b.slot_ids, b.weights, parts, fmt, cells, "silu")
    return lambda: moe_prefill(b.x, b.slot_ids, b.weights, parts["gate_up"], parts["down"], cells, "silu")


def measure(fmt_name: str, hidden: int, inter: int, slots: int, prefill_tokens: int, reps: int) -> list[dict[str, Any]]:
    fmt, parts = expert_format(fmt_name), _banks(fmt_name, hidden, inter, slots)
    rows = []
    for tokens in (1, 4):
        b = moe_batch(tokens, 8, hidden, inter, slots, torch.bfloat16, device="cuda", seed=tokens)
        cells = torch.zeros(tokens, 8, hidden, device="cuda")
        seconds = _time(_decode_call(fmt, b, parts, cells), reps)
        experts_read = len(set(b.slot_ids.flatten().tolist()))
        nbytes = experts_read * expert_nbytes(fmt, hidden, inter)
        rows.append({"format": fmt_name, "phase": "decode", "tokens": tokens, "us": seconds * 1e6,
                     "gb_s": nbytes / seconds / 1e9})
    b = moe_batch(prefill_tokens, 8, hidden, inter, slots, torch.bfloat16, device="cuda", seed=9)
    cells = torch.zeros(prefill_tokens, 8, hidden, device="cuda")
    flops = 2 * prefill_tokens * 8 * 3 * hidden * inter
    variants = [("weight-only", "0"), ("fp8 dot", "1")] if fmt_name == "fp8" else [("", "0")]
    for label, f8 in variants:
        os.environ["EDGEMOE_FP8_DOT"] = f8
        seconds = _time(_prefill_call(fmt, b, parts, cells), max(3, reps // 10))
        rows.append({"format": fmt_name + (f" {label}" if label else ""), "phase": "prefill", "tokens": prefill_tokens,
                     "us": seconds * 1e6, "tflop_s": flops / seconds / 1e12})
    os.environ.pop("EDGEMOE_FP8_DOT", None)
    return rows


def run_moe_quant_bench(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("edgemoe bench moe-quant: needs a CUDA device")
        return 2
    rows = [r for f in args.formats for r in measure(f, args.hidden, args.intermediate, args.slots,
                                                       args.prefill_tokens, args.reps)]
    for r in rows:
        rate = f"{r['gb_s']:8.1f} GB/s of weights" if r["phase"] == "decode" else f"{r['tflop_s']:8.1f} TFLOP/s"
        print(f"  {r['format']:18s} {r['phase']:7s} T={r['tokens']:<5d} {r['us']:9.1f} µs  {rate}")
    path = write_result(args.out, "moe-quant", {"hidden": args.hidden, "intermediate": args.intermediate,
                                                "slots": args.slots, "device": torch.cuda.get_device_name(), "rows": rows})
    decode = {f"{r['format']} T={r['tokens']}": r["gb_s"] for r in rows if r["phase"] == "decode"}
    png = plot_bars(path, "edgemoe bench moe-quant: fused MoE decode", "GB/s of weights (format bytes)", decode, {})
    print(f"wrote {path} and {png}")
    return 0
