"""`edgemoe plan`'s report: the header lines, the table (the `--expert-dtype auto` row marked *),
the start-up warnings it would give, and what of it is measured and what only modelled."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from edgemoe import plan_speed as speed
from edgemoe.plan_checkpoint import UNQUANTISED, Checkpoint, checkpoint_line

if TYPE_CHECKING:
    from edgemoe.plan import Prediction, Rates


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return "resident" if math.isinf(x) else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(name: str, arch: Any, budget: int, context: int, rates: Rates, rows: list[Prediction],
           args: argparse.Namespace, ckpt: Checkpoint = UNQUANTISED) -> str:
    from edgemoe.engine.budget import GiB, dense_weight_bytes

    moe_layers = len(arch.moe_layers)
    lines = [
        (f"model      {name} ({arch.model_type}): {moe_layers} MoE layers x {arch.num_experts} experts, "
        f"{arch.top_k} per token; dense weights {dense_weight_bytes(arch) / GiB:.2f} GiB"),
        f"experts    {checkpoint_line(ckpt, arch.dtype, any(r.auto for r in rows))}",
        f"budget     {budget / GiB:.2f} GiB (--gpu-memory), CUDA context {context / GiB:.2f} GiB (--cuda-context)",
        f"rates      {_rates_line(rates)}",
        f"misses     {_misses_line(args)}",
        f"decode     batch 1 at {args.context_tokens} tokens of context (--context-tokens)",
        "",
        (f"{'format':<6} {'expert':>9} {'backend':>8} {'slots':>6} {'share':>6} {'KV tok':>7} {'hit':>5} "
        f"{'miss/tok':>8} {'base ms':>7} {'copy ms':>7} {'decode tok/s':>12} {'copy+CPU':>8} "
        f"{'prefill@' + str(args.max_prefill_tokens):>13}"),
    ]
    lines += [_row(r) for r in rows]
    return "\n".join(lines + [""] + _pool_warnings(arch, rows) + provenance(rates, args))


def _rates_line(rates: Rates) -> str:
    return (f"PCIe {_gbps(rates.pcie_gbps)}, device {_gbps(rates.device_gbps)}"
            + (f" ({rates.gpu})" if rates.gpu else "") + f", CPU experts {_gbps(rates.cpu_gbps)}"
            + (f", host read {_gbps(rates.host_read_gbps)}" if rates.host_read_gbps else "")
            + f" ({rates.source or 'none'})")


def _row(r: Prediction) -> str:
    """A format's row; `*` after the format `--expert-dtype auto` loads the checkpoint's experts in."""
    return (f"{r.fmt + '*' * r.auto:<6} {r.expert_bytes / 1e6:>7.2f}MB {r.backend:>8} {r.num_slots:>6} "
            f"{r.slot_share:>6.1%} {r.kv_tokens:>7} {r.hit_rate:>5.2f} {r.misses_per_token:>8.1f} "
            f"{_ms(r.step.base_ms if r.step else None):>7} {_ms(r.step.copy_ms if r.step else None):>7} "
            f"{_rate(r.decode):>12} {_rate(r.decode_copy_cpu):>8} {_rate(r.prefill):>13}")


def _pool_warnings(arch: Any, rows: list[Prediction]) -> list[str]:
    """The start-up warning of a slot pool below one token's experts, per format it hits."""
    from edgemoe.engine.budget import slot_pool_warning

    out = []
    for r in rows:
        text = slot_pool_warning(r.num_slots, len(arch.moe_layers), arch.moe_pairs) if r.backend != "resident" else None
        if text:
            out.append(f"warning    {r.fmt}: {text}")
    return out


def _misses_line(args: argparse.Namespace) -> str:
    if args.misses_per_token is not None:
        return f"{args.misses_per_token:g} per token as given (--misses-per-token): the hit-rate model is not used"
    how = ("uniform routing: hit rate = slot share" if args.routing_locality == 0
           else f"routing locality {args.routing_locality:.2f} (--routing-locality)")
    return f"modelled, {how}"


def provenance(rates: Rates, args: argparse.Namespace) -> list[str]:
    """What in the table was measured and what is only modelled."""
    cal = speed.CALIBRATION
    measured_formats = ", ".join(speed.EXPERT_EFFICIENCY)
    lines = [
        (f"measured   the decode step given its misses: constants fitted to `bench decode` runs on one {cal.gpu} "
        f"(device {cal.device_gbps:,.0f} GB/s, PCIe {cal.pcie_gbps:.1f} GB/s; batch 1, CUDA graphs, device expert "
        f"cache), reproduced within 15% (docs/plan.md): expert kernels {measured_formats}, KV, slot cache, copies"),
        "modelled   " + "; ".join(_modelled(rates, args)),
    ]
    if rates.pcie_gbps is None or rates.device_gbps is None:
        lines.append("no PCIe or device rate: run `edgemoe bench bw` on the GPU machine, or pass --pcie-gbps and "
                     "--device-gbps (and --cpu-gbps)")
    return lines


def _modelled(rates: Rates, args: argparse.Namespace) -> list[str]:
    out = []
    if args.misses_per_token is None and not speed.HIT_RATE_CALIBRATED:
        out.append("misses per token (hit-rate model, not calibrated: that needs a trained checkpoint's routing; "
                   "the random presets' router is not one)")
    borrowed = [f"{f} (as {speed.BORROWED_EFFICIENCY[f]})" for f in args.formats if f in speed.BORROWED_EFFICIENCY]
    if borrowed:
        out.append("expert kernel efficiency of " + ", ".join(borrowed) + ", not measured")
    if rates.gpu != speed.CALIBRATION.gpu:
        out.append(f"other GPUs: the base step scaled by the device bandwidth (kernels assumed to reach the "
                   f"{speed.CALIBRATION.gpu}'s share of it), the slot cache's {speed.SLOT_CACHE_US:.0f} µs "
                   "a layer kept")
    if not speed.CPU_SHARE_CALIBRATED:
        out.append("copy+CPU (uncalibrated: no run measured the CPU's share beside the device cache)")
    out.append(f"prefill (chunks of {args.max_prefill_tokens}: streamed when >= 1,024 tokens, the copies of every "
               f"expert not held x {speed.STREAM_EFFICIENCY:.2f}, "
               f"else the copy bound x {speed.PREFILL_EFFICIENCY:.2f}; "
               "fitted to synthetic-routing runs; "
               "it assumes the chunk routes like the hit-rate model: a model that concentrates a prompt on "
               "few experts prefills faster)")
    return out


def _gbps(x: float | None) -> str:
    return "unknown" if x is None else f"{x:,.1f} GB/s"
