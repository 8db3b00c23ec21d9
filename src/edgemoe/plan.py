"""`edgemoe plan`: the memory plan and the speed to expect, before downloading or loading anything.

Reads only the model's `config.json` (or a random preset's), plans device memory exactly
as the engine would (`engine/budget.py`), each format resolved as `--expert-dtype` is
against the checkpoint's `quantization_config` (`plan_checkpoint.py`), and predicts, per
expert format:

- misses per token from the hit-rate model (uniform routing, or `--routing-locality`), or
  as given (`--misses-per-token`, e.g. a `bench decode` run's, to check the speed model);
- decode tok/s at batch 1 from the speed model (`plan_speed.py`, docs/plan.md): a step is
  the device's reads (dense weights, the token's experts, KV at `--context-tokens`) at the
  device bandwidth × kernel efficiencies, plus the misses' copies at the PCIe rate × a copy
  efficiency, constants fitted to `bench decode` runs on an H200;
- prefill tok/s for one `--max-prefill-tokens` chunk: a chunk of N tokens touches a share
  1 − (1 − k/E)^N of each layer's experts; those not resident are copied once (a bound ×
  an efficiency fitted to a synthetic-routing run, docs/plan.md).

Rates come from `--pcie-gbps`/`--cpu-gbps`/`--device-gbps`, else from the newest
`edgemoe bench bw` result under `--bench-dir`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemoe import plan_speed as speed
from edgemoe.plan_checkpoint import UNQUANTISED, Checkpoint, checkpoint_of

FORMATS = ("bf16", "fp8", "int8", "int4", "mxfp4")
DEFAULT_BENCH_DIR = "bench/results"


@dataclass(frozen=True)
class Rates:
    pcie_gbps: float | None  # pinned host→device copies of one expert, GB/s
    cpu_gbps: float | None  # the CPU expert kernel at batch 1, GB/s of weights
    host_read_gbps: float | None  # host memory read: caps both paths together
    device_gbps: float | None  # the device's memory bandwidth (read + write traffic), GB/s
    gpu: str | None  # the GPU the `bench bw` result was measured on
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
    step: speed.StepTime | None  # the decode step, copies only (offload / device cache)
    decode_copy_cpu: float | None  # predicted tok/s with the CPU's share (hybrid; uncalibrated)
    prefill: float | None
    backend: str
    auto: bool = False  # the format `--expert-dtype auto` (the default) loads the checkpoint's experts in

    @property
    def decode(self) -> float | None:
        return self.step.tok_s if self.step is not None else None


def hit_rate(slots: int, total_experts: int, active: int, locality: float, per_layer: int) -> float:
    """The hit-rate model: a share `locality` of a token's routed experts were routed by the
    tokens just before (resident when the slots hold a token's `active` experts), the rest
    are independent and uniform (resident with the slot share).

    NOTE: with fewer slots than `active` (the layers share one pool, visited in a cycle)
    the scan-resistant LRU (`moe/policy.ScanLRUPolicy`) keeps all but about one layer's
    `per_layer` experts of the cycle resident and streams the rest through those slots:
    (slots - per_layer) / active of the reused experts hit. A replay of a repeating routing
    (tests/moe/test_replay.py) gets Belady's hits, slightly more than this floor: 48 x 8
    through 276 slots, 71.2% against 69.8%. Plain LRU (`--moe-policy lru-plain`) hits
    none of them there (measured on an H200: 384 misses a token)."""
    share = min(1.0, slots / total_experts)
    recent = 1.0 if slots >= active else max(0, slots - per_layer) / active
    return min(1.0, locality * recent + (1 - locality) * share)


def latest_bw(bench_dir: Path) -> Path | None:
    files = sorted(bench_dir.glob("bw-*.json"))  # named bw-YYYYMMDD-HHMMSS.json
    return files[-1] if files else None


def _is_rate(x: Any) -> bool:
    """A rate in GB/s: a finite number > 0."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf


def _bench_dir(args: argparse.Namespace) -> Path:
    if args.bench_dir is None:
        return Path(DEFAULT_BENCH_DIR)
    if not Path(args.bench_dir).is_dir():  # given: a typo is refused, not read as "no result yet"
        raise ValueError(f"--bench-dir {args.bench_dir}: no such directory")
    return Path(args.bench_dir)


def _named(args: argparse.Namespace, path: Path) -> str:
    return f"--bw-json {path}" if args.bw_json is not None else f"{path} (the newest under --bench-dir)"


def rates_from(args: argparse.Namespace) -> Rates:
    given = (args.pcie_gbps, args.cpu_gbps, args.device_gbps)
    path = Path(args.bw_json) if args.bw_json is not None else latest_bw(_bench_dir(args))
    if path is None or None not in given:
        return Rates(*given[:2], None, given[2], None, "given")
    try:  # a file that is not a `bench bw` result is named, whatever its shape
        data = json.loads(path.read_text())
        decode_rows = [r["gb_s"] for r in data.get("experts", [])  # cache-resident rows are no CPU path's rate
                       if r.get("tokens") == 1 and r.get("experts_per_call", 1) > 1 and not r.get("cache_resident")]
        copies = data.get("copies", {})
        d2d = copies.get("d2d_1GiB_gb_s")
        measured = (copies.get("h2d_pinned_expert_gb_s"), max(decode_rows) if decode_rows else None,
                    2 * d2d if d2d else None)  # a d2d copy reads and writes each byte: twice its rate in traffic
        host_read, gpu = data.get("host", {}).get("kernel_read_gb_s"), data.get("env", {}).get("gpu")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError, KeyError) as e:
        raise ValueError(f"{_named(args, path)}: not a readable `edgemoe bench bw` result ({e})") from None
    if not all(x is None or _is_rate(x) for x in (*measured, host_read)):
        raise ValueError(f"{_named(args, path)}: not an `edgemoe bench bw` result (a rate is not a positive number)")
    pcie, cpu, device = (g if g is not None else m for g, m in zip(given, measured))
    source = f"{path}" if given == (None, None, None) else f"given, else {path}"
    return Rates(pcie, cpu, host_read, device, gpu if args.device_gbps is None else None, source)


def _model(model: str | None) -> tuple[str, Any, Checkpoint]:
    """(name, DecoderArch, its checkpoint's expert format) from the config files alone: no
    weights, no tokenizer. A random preset has no quantization_config."""
    from edgemoe.engine.model_source import resolve_model
    from edgemoe.models.presets import is_random, parse_random
    from edgemoe.models.registry import model_arch

    if is_random(model):
        spec = parse_random(model)  # type: ignore[arg-type]
        return spec.name, model_arch(spec.config, model), UNQUANTISED  # type: ignore[arg-type]
    source = resolve_model(model)
    where = source.model_dir / "config.json"
    return source.name, model_arch(source.config, where), checkpoint_of(source.config, where)


def streams(chunk: int, slots: int, experts: int) -> bool:
    """Whether a full chunk streams through the device cache's lent slots (moe/prefill_stream.py,
    with the engine's threshold: EDGEMOE_PREFILL_STREAM_TOKENS read the same way)."""
    from edgemoe.moe.prefill_stream import stream_min_tokens

    threshold = stream_min_tokens()
    return 0 < threshold <= chunk and slots >= 2 * experts


def predict(arch: Any, fmt: str, budget: int, context: int, args: argparse.Namespace, rates: Rates,
            ckpt: Checkpoint = UNQUANTISED) -> Prediction:
    import torch

    from edgemoe.engine.big_tables import auto_embed_on_host, check_embed_setting, embed_nbytes
    from edgemoe.engine.budget import expert_nbytes, plan_memory
    from edgemoe.moe.slot_lending import lend_tokens

    form = ckpt.resolve(fmt, arch.dtype)  # as the engine: the checkpoint's own kind keeps its group / block
    e_bytes = expert_nbytes(arch, form)  # what a slot holds and a miss copies, scales included

    def plan_with(embed_on_host: bool) -> Any:
        return plan_memory(
            arch, backend=args.moe_backend, moe_slots=args.moe_slots, kv_tokens=args.kv_tokens,
            max_model_len=args.max_model_len or arch.max_position_embeddings,
            max_prefill_tokens=args.max_prefill_tokens, max_running=args.max_running_requests, budget=budget,
            context=context, expert_format=form,
            graph_max_bs=min(args.cuda_graph_max_bs, args.max_running_requests),  # as the engine plans on a GPU
            # the device cache's streamed chunks borrow from the slots, as on a GPU (docs/offload.md)
            lend_tokens=lend_tokens() if args.moe_backend in ("offload", "hybrid", "auto") else 0,
            host_params=("embed",) if embed_on_host else (),
        )

    plan = plan_with(check_embed_setting(args.embed_weights, arch))
    if auto_embed_on_host(args.embed_weights, arch, torch.device("cuda"), plan.backend, lambda: embed_nbytes(arch)):
        plan = plan_with(True)  # as the engine on a GPU, the host assumed to have the room
    moe_layers, K, E = len(arch.moe_layers), arch.top_k, arch.num_experts
    total = moe_layers * E
    resident = plan.backend == "resident"
    slots = total if resident else plan.num_slots
    h = hit_rate(slots, total, moe_layers * K, args.routing_locality, K)
    misses = (1 - h) * moe_layers * K
    if args.misses_per_token is not None:  # given: and the hit rate it implies, for the table
        misses, h = args.misses_per_token, max(0.0, 1.0 - args.misses_per_token / (moe_layers * K))
    misses = 0.0 if resident else misses
    step = both = prefill = None
    if rates.pcie_gbps:
        if not resident and streams(args.max_prefill_tokens, slots - plan.lend_slots, E):
            prefill = speed.STREAM_EFFICIENCY * speed.prefill_streamed(  # the lent slots hold nothing meanwhile
                rates.pcie_gbps, args.max_prefill_tokens, moe_layers, E, slots - plan.lend_slots, e_bytes)
        else:
            prefill = speed.PREFILL_EFFICIENCY * speed.prefill_bound(
                rates.pcie_gbps, args.max_prefill_tokens, moe_layers, E, K, slots / total, e_bytes)
    if rates.pcie_gbps and rates.device_gbps:
        def at(miss_gbps: float) -> speed.StepTime:
            return speed.decode_step(arch, fmt, e_bytes, args.context_tokens, misses, not resident,
                                     rates.device_gbps, miss_gbps)  # type: ignore[arg-type]

        step = at(rates.pcie_gbps)
        if rates.cpu_gbps:
            rate = rates.pcie_gbps + rates.cpu_gbps
            if rates.host_read_gbps:  # both paths read host memory: its bandwidth caps the sum
                rate = min(rate, rates.host_read_gbps)
            both = at(rate).tok_s
    return Prediction(fmt, e_bytes, slots, slots / total, plan.kv_tokens, h, misses, step, both, prefill, plan.backend,
                      ckpt.is_auto(fmt, arch.dtype))


# --------------------------------------------------------------------------- command line

# Engine settings the plan depends on, with the engine's own defaults and help.
PLAN_SETTINGS = ("max_model_len", "kv_tokens", "max_running_requests", "max_prefill_tokens", "moe_backend", "moe_slots",
                 "cuda_graph_max_bs", "embed_weights")


def add_plan_parser(sub: Any) -> None:
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
    plan.add_argument("--device-gbps", type=float, default=None,
                      help="the GPU's memory bandwidth, GB/s, e.g. 960 for a 16 GB RTX 5080 (default: twice the "
                           "d2d copy rate of the newest `edgemoe bench bw` result)")
    plan.add_argument("--bw-json", default=None, help="a `bench bw` result to read rates from (default: the newest)")
    plan.add_argument("--bench-dir", default=None,
                      help=f"where `bench bw` wrote its results (default: {DEFAULT_BENCH_DIR})")
    plan.add_argument("--context-tokens", type=int, default=4096,
                      help="tokens in the sequence while decoding: the KV a step reads (default: 4096)")
    plan.add_argument("--routing-locality", type=float, default=0.0,
                      help="what-if: share of a token's experts the previous tokens routed too (0: uniform routing)")
    plan.add_argument("--misses-per-token", type=float, default=None,
                      help="expert misses per decode token, instead of the hit-rate model (e.g. a `bench decode` "
                           "run's decode_moe.misses_per_token, to check the speed model; default: modelled)")
    plan.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS),
                      help="expert formats to plan (default: all)")
    _add_engine_settings(plan)


def _add_engine_settings(plan: Any) -> None:
    from edgemoe.config import setting_fields

    by_name = {f.name: f for f in setting_fields()}
    group = plan.add_argument_group("engine settings the plan depends on")
    for name in PLAN_SETTINGS:
        f = by_name[name]
        group.add_argument("--" + name.replace("_", "-"), dest=name, default=f.default,
                           choices=f.metadata.get("choices"),
                           type=int if isinstance(f.default, int) or "int" in str(f.type) else str,
                           help=f.metadata.get("help"))


def plan_rows(args: argparse.Namespace) -> tuple[str, Any, Rates, list[Prediction]]:
    """What `edgemoe plan` prints: (model name, arch, rates, a prediction per format)."""
    name, arch, _, rates, rows = _planned(args)
    return name, arch, rates, rows


def _planned(args: argparse.Namespace) -> tuple[str, Any, Checkpoint, Rates, list[Prediction]]:
    from edgemoe.config import EngineConfig
    from edgemoe.engine.budget import parse_size

    if not 0.0 <= args.routing_locality <= 1.0:
        raise ValueError(f"--routing-locality must be between 0 and 1 (got {args.routing_locality})")
    if args.context_tokens < 1:
        raise ValueError(f"--context-tokens must be at least 1 (got {args.context_tokens})")
    for name in ("pcie_gbps", "cpu_gbps", "device_gbps"):
        if getattr(args, name) is not None and not _is_rate(getattr(args, name)):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number of GB/s "
                             f"(got {getattr(args, name)})")
    EngineConfig.from_kwargs(**{name: getattr(args, name) for name in PLAN_SETTINGS})  # the engine's own checks
    name, arch, ckpt = _model(args.model)
    cells = len(arch.moe_layers) * arch.moe_pairs
    if args.misses_per_token is not None and not 0.0 <= args.misses_per_token <= cells:
        raise ValueError(f"--misses-per-token must be between 0 and {cells} (MoE layers x experts a token) "
                         f"for {name} (got {args.misses_per_token})")
    budget = parse_size(args.gpu_memory)
    try:
        context = parse_size(args.cuda_context)
    except ValueError:
        raise ValueError(f"--cuda-context: cannot parse size {args.cuda_context!r} (e.g. 0.5GiB, 900MiB)") from None
    rates = rates_from(args)
    rows = [predict(arch, fmt, budget, context, args, rates, ckpt) for fmt in args.formats]
    return name, arch, ckpt, rates, rows


def run_plan(args: argparse.Namespace) -> int:
    from edgemoe.engine.budget import parse_size
    from edgemoe.plan_report import report

    name, arch, ckpt, rates, rows = _planned(args)
    print(report(name, arch, parse_size(args.gpu_memory), parse_size(args.cuda_context), rates, rows, args, ckpt))
    return 0
