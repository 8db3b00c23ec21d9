"""`edgemoe plan`: the memory plan and the speed to expect, before downloading or loading anything.

Reads only the model's `config.json` (or a random preset's), plans device memory exactly
as the engine would (`engine/budget.py`), and predicts, per expert format:

- decode tok/s from the copy (+ CPU) bound of docs/offload.md / PERF-NOTES:
  tok/s ≤ (B_pcie [+ B_cpu]) / ((1 − h) · bytes per token), bytes per token = MoE layers ×
  experts per token × bytes per expert, h the slot cache's hit rate;
- prefill tok/s for one `--max-prefill-tokens` chunk: a chunk of N tokens touches a share
  1 − (1 − k/E)^N of each layer's experts; those not resident are copied once per chunk.

A prediction is the bound × an efficiency constant (what the engine reaches of the bound,
calibrated from `edgemoe bench decode` runs). Rates come from `--pcie-gbps`/`--cpu-gbps`,
else from the newest `edgemoe bench bw` result under `--bench-dir`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# NOTE: PLACEHOLDERS, not measurements. The share of the bound the engine reaches, to be
# calibrated from `bench decode` runs on the GPU machine (bf16 / 16 GiB, fp8 / 16 GiB,
# bf16 / 8 GiB; issue 17 asks for predictions within 15%). Until then the output says so.
DECODE_EFFICIENCY = 0.5
PREFILL_EFFICIENCY = 0.5
EFFICIENCY_CALIBRATED = False

# Bytes per expert parameter, scales included: fp8 with one fp32 scale per 128 × 128 block,
# int8 with one per row, int4 with a bf16 scale per group of 128, mxfp4 with an 8-bit
# scale per 32 (OCP MX). bf16 is what checkpoints ship and the engine runs today.
FORMATS: dict[str, float] = {
    "bf16": 2.0,
    "fp8": 1.0 + 4 / (128 * 128),
    "int8": 1.0,  # + one scale per row of thousands: below a thousandth
    "int4": 0.5 + 2 / 128,
    "mxfp4": 0.5 + 1 / 32,
}
GB = 1e9


@dataclass(frozen=True)
class Rates:
    pcie_gbps: float | None  # pinned host→device copies of one expert, GB/s
    cpu_gbps: float | None  # the CPU expert kernel at batch 1, GB/s of weights
    host_read_gbps: float | None  # host memory read: caps both paths together
    source: str


@dataclass(frozen=True)
class Prediction:
    fmt: str
    expert_bytes: int
    num_slots: int
    slot_share: float  # slots / routed experts of the model
    kv_tokens: int
    hit_rate: float
    misses_per_token: float
    decode_copy: float | None  # predicted tok/s, copies only (offload)
    decode_copy_cpu: float | None  # copies and CPU experts together (hybrid)
    prefill: float | None
    backend: str


def hit_rate(slots: int, total_experts: int, active: int, locality: float) -> float:
    """The hit-rate model: a share `locality` of a token's routed experts were routed by the
    tokens just before (resident under LRU when the slots hold a token's `active` experts),
    the rest are independent and uniform (resident with the slot share)."""
    share = min(1.0, slots / total_experts)
    recent = min(1.0, slots / active) if active else 1.0
    return min(1.0, locality * recent + (1 - locality) * share)


def decode_bound(rate_gbps: float, misses_per_token: float, expert_bytes: int) -> float:
    """tok/s when each token's missed experts move at `rate_gbps`."""
    if misses_per_token <= 0:
        return math.inf
    return rate_gbps * GB / (misses_per_token * expert_bytes)


def prefill_bound(pcie_gbps: float, chunk: int, moe_layers: int, experts: int, top_k: int,
                  resident_share: float, expert_bytes: int) -> float:
    """tok/s for one chunk whose touched, non-resident experts are copied once."""
    touched = 1 - (1 - top_k / experts) ** chunk
    copied = moe_layers * experts * touched * (1 - resident_share) * expert_bytes
    return math.inf if copied <= 0 else chunk * pcie_gbps * GB / copied


def latest_bw(bench_dir: Path) -> Path | None:
    files = sorted(bench_dir.glob("bw-*.json"))  # named bw-YYYYMMDD-HHMMSS.json
    return files[-1] if files else None


def rates_from(args: argparse.Namespace) -> Rates:
    pcie, cpu, read, source = args.pcie_gbps, args.cpu_gbps, None, "given"
    path = Path(args.bw_json) if args.bw_json else latest_bw(Path(args.bench_dir))
    if path is not None and (pcie is None or cpu is None):
        data = json.loads(path.read_text())
        decode_rows = [r["gb_s"] for r in data.get("experts", []) if r.get("tokens") == 1 and r.get("experts_per_call", 1) > 1]
        pcie = pcie if pcie is not None else data.get("copies", {}).get("h2d_pinned_expert_gb_s")
        cpu = cpu if cpu is not None else (max(decode_rows) if decode_rows else None)
        read = data.get("host", {}).get("kernel_read_gb_s")
        source = f"{path}" if args.pcie_gbps is None and args.cpu_gbps is None else f"given, else {path}"
    return Rates(pcie, cpu, read, source)


def _arch(model: str | None) -> tuple[str, Any]:
    """(name, DecoderArch) from the config alone: no weights, no tokenizer."""
    from edgemoe.engine.model_source import resolve_model
    from edgemoe.models.presets import is_random, parse_random
    from edgemoe.models.registry import model_arch

    if is_random(model):
        spec = parse_random(model)  # type: ignore[arg-type]
        return spec.name, model_arch(spec.config, model)  # type: ignore[arg-type]
    source = resolve_model(model)
    return source.name, model_arch(source.config, source.model_dir / "config.json")


def predict(arch: Any, fmt: str, budget: int, context: int, args: argparse.Namespace, rates: Rates) -> Prediction:
    from edgemoe.engine.budget import plan_memory

    e_bytes = int(3 * arch.hidden_size * arch.moe_intermediate_size * FORMATS[fmt])
    plan = plan_memory(
        arch, backend=args.moe_backend, moe_slots=args.moe_slots, kv_tokens=args.kv_tokens,
        max_model_len=args.max_model_len or arch.max_position_embeddings, max_prefill_tokens=args.max_prefill_tokens,
        max_running=args.max_running_requests, budget=budget, context=context, expert_bytes=e_bytes,
        graph_max_bs=min(args.cuda_graph_max_bs, args.max_running_requests),  # as the engine plans on a GPU
    )
    moe_layers, K, E = len(arch.moe_layers), arch.top_k, arch.num_experts
    total = moe_layers * E
    slots = total if plan.backend == "resident" else plan.num_slots
    h = hit_rate(slots, total, moe_layers * K, args.routing_locality)
    misses = (1 - h) * moe_layers * K
    copy = cpu = prefill = None
    if rates.pcie_gbps:
        copy = DECODE_EFFICIENCY * decode_bound(rates.pcie_gbps, misses, e_bytes)
        prefill = PREFILL_EFFICIENCY * prefill_bound(rates.pcie_gbps, args.max_prefill_tokens, moe_layers, E, K,
                                                     slots / total, e_bytes)
        if rates.cpu_gbps:
            both = rates.pcie_gbps + rates.cpu_gbps
            if rates.host_read_gbps:  # both paths read host memory: its bandwidth caps the sum
                both = min(both, rates.host_read_gbps)
            cpu = DECODE_EFFICIENCY * decode_bound(both, misses, e_bytes)
    return Prediction(fmt, e_bytes, slots, slots / total, plan.kv_tokens, h, misses, copy, cpu, prefill, plan.backend)


# --------------------------------------------------------------------------- command line

# Engine settings the plan depends on, with the engine's own defaults and help.
PLAN_SETTINGS = ("max_model_len", "kv_tokens", "max_running_requests", "max_prefill_tokens", "moe_backend", "moe_slots",
                 "cuda_graph_max_bs")


def add_plan_parser(sub: Any) -> None:
    from edgemoe.config import setting_fields

    plan = sub.add_parser("plan", help="memory plan and predicted tok/s for a model and a GPU size, nothing loaded",
                          description=__doc__.split("\n\n", 1)[1])
    plan.add_argument("--model", default=None,
                      help="model directory (only config.json is read) or random:PRESET (default: the demo model)")
    plan.add_argument("--gpu-memory", required=True, help="the GPU's memory to plan for, e.g. 16GiB")
    plan.add_argument("--cuda-context", default="0.5GiB",
                      help="what the CUDA context and libraries take of it (measured by `serve`; estimated here)")
    plan.add_argument("--pcie-gbps", type=float, default=None,
                      help="host→device copy rate, GB/s (default: from the newest `edgemoe bench bw` result)")
    plan.add_argument("--cpu-gbps", type=float, default=None,
                      help="CPU expert rate, GB/s of weights (default: from the newest `edgemoe bench bw` result)")
    plan.add_argument("--bw-json", default=None, help="a `bench bw` result to read rates from (default: the newest)")
    plan.add_argument("--bench-dir", default="bench/results", help="where `bench bw` wrote its results")
    plan.add_argument("--routing-locality", type=float, default=0.0,
                      help="what-if: share of a token's experts the previous tokens routed too (0: uniform routing)")
    plan.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS),
                      help="expert formats to plan")
    by_name = {f.name: f for f in setting_fields()}
    group = plan.add_argument_group("engine settings the plan depends on")
    for name in PLAN_SETTINGS:
        f = by_name[name]
        group.add_argument("--" + name.replace("_", "-"), dest=name, default=f.default, choices=f.metadata.get("choices"),
                           type=int if isinstance(f.default, int) or "int" in str(f.type) else str,
                           help=f.metadata.get("help"))


def run_plan(args: argparse.Namespace) -> int:
    from edgemoe.engine.budget import parse_size

    if not 0.0 <= args.routing_locality <= 1.0:
        raise ValueError(f"--routing-locality must be between 0 and 1 (got {args.routing_locality})")
    budget, context = parse_size(args.gpu_memory), parse_size(args.cuda_context)
    name, arch = _arch(args.model)
    rates = rates_from(args)
    rows = [predict(arch, fmt, budget, context, args, rates) for fmt in args.formats]
    print(report(name, arch, budget, context, rates, rows, args))
    return 0


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return "resident" if math.isinf(x) else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def report(name: str, arch: Any, budget: int, context: int, rates: Rates, rows: list[Prediction],
           args: argparse.Namespace) -> str:
    from edgemoe.engine.budget import GiB, dense_weight_bytes

    moe_layers = len(arch.moe_layers)
    lines = [
        f"model      {name} ({arch.model_type}): {moe_layers} MoE layers x {arch.num_experts} experts, "
        f"{arch.top_k} per token; dense weights {dense_weight_bytes(arch) / GiB:.2f} GiB",
        f"budget     {budget / GiB:.2f} GiB (--gpu-memory), CUDA context {context / GiB:.2f} GiB (--cuda-context)",
        f"rates      PCIe {_gbps(rates.pcie_gbps)}, CPU experts {_gbps(rates.cpu_gbps)}"
        + (f", host read {_gbps(rates.host_read_gbps)}" if rates.host_read_gbps else "") + f" ({rates.source or 'none'})",
        f"hit rate   modelled: routing locality {args.routing_locality:.2f} "
        + ("(uniform routing: hit rate = slot share)" if args.routing_locality == 0 else "(--routing-locality)"),
        "",
        f"{'format':<6} {'expert':>9} {'backend':>8} {'slots':>6} {'share':>6} {'KV tok':>7} {'hit':>5} "
        f"{'miss/tok':>8} {'decode copy':>11} {'copy+CPU':>9} {'prefill@' + str(args.max_prefill_tokens):>13}",
    ]
    for r in rows:
        lines.append(
            f"{r.fmt:<6} {r.expert_bytes / 1e6:>7.2f}MB {r.backend:>8} {r.num_slots:>6} {r.slot_share:>6.1%} "
            f"{r.kv_tokens:>7} {r.hit_rate:>5.2f} {r.misses_per_token:>8.1f} {_rate(r.decode_copy):>11} "
            f"{_rate(r.decode_copy_cpu):>9} {_rate(r.prefill):>13}")
    lines.append("")
    lines.append("tok/s = bound x efficiency (decode %.2f, prefill %.2f)%s." % (
        DECODE_EFFICIENCY, PREFILL_EFFICIENCY,
        "" if EFFICIENCY_CALIBRATED else ": PLACEHOLDER constants, not yet calibrated against `bench decode`"))
    if rates.pcie_gbps is None:
        lines.append("no PCIe rate: run `edgemoe bench bw` on the GPU machine, or pass --pcie-gbps (and --cpu-gbps)")
    return "\n".join(lines)


def _gbps(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.1f} GB/s"
