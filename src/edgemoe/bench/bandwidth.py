"""`edgemoe bench bw`: the rates expert offload plans with, measured on this machine.

- Host memory read bandwidth: every physical core reading a large buffer (the CPU
  expert kernel's thread pool), and torch's `sum` for comparison.
- The CPU expert path: GB/s of bf16 weights for one expert (default Qwen3-30B-A3B's:
  H=2048, I=768, 9.44 MB; `--hidden`, `--intermediate`) at n = 1, 8, 32 tokens, and a layer's 8 experts at n = 1 in one call
  (batch-1 decode), per kernel variant this CPU runs, beside torch's bf16 path; the
  calls go through `moe_experts_partial_cpu`, the executors' entry point.
- Prompt-shaped calls (`--prompt-shapes TOKENSxEXPERTS ...`, default 32x16 and 16x32):
  many experts a call, each on many tokens — a prompt chunk's CPU share of a layer —
  reported as GB/s of weights and TFLOP/s (6·H·I flops a token an expert).
- Quantised experts (`--weights int8 fp8 int4`): the same cases with int8 (per-row
  scales), fp8 e4m3 (128x128 block scales) and int4 (groups of 128: fp16 scales, zero
  points) weights, GB/s of the format's bytes (scales and zero points included).
- With CUDA: pinned and pageable host→device copies of one expert and of 256 MiB, a
  device-to-device copy, and the device cache's gather (the SMs reading the pinned pool
  mapped into the device) of one expert a call at the decode step's grid and at decode
  prefetch's side grid: hosts differ here (2026-12-07, two H100 hosts: 33 and 48 GB/s
  gathered against 48.8 and 47.7 by the copy engine).
Experts rotate through a pool larger than the caches, so every call reads RAM.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from edgemoe.bench.copy_rates import copy_rates
from edgemoe.bench.host_counters import counters_delta, disturbance, host_counters
from edgemoe.bench.results import plot_bars, write_result
from edgemoe.engine.host_budget import mem_available
from edgemoe.kernels import cpu_isa
from edgemoe.kernels.cpu_experts import bank_job_table, moe_experts_partial_cpu
from edgemoe.kernels.cpu_experts_quant import moe_experts_q_cpu, native_weights, quant_job_table
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.quant import Parts, expert_format, expert_nbytes, expert_specs

LAYER_EXPERTS = 8  # routed experts per token
GEMM_CAPABLE = ("amx", "avx512")


def prompt_cases(kernel: CpuExperts, shapes: Sequence[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """(tokens, experts a call, path) of the prompt shapes, on kernels with a blocked path."""
    return [(t, e, "default") for t, e in shapes] if kernel.name in GEMM_CAPABLE else []


def add_tflops(row: dict[str, Any], hidden: int, inter: int) -> dict[str, Any]:
    """The call's arithmetic rate beside its bytes: 6·H·I flops a token an expert."""
    flops = 6 * hidden * inter * row["tokens"] * row["experts_per_call"]
    for prefix in ("", "kernel_"):
        if f"{prefix}us_per_call" in row:
            row[f"{prefix}tflops"] = flops / (row[f"{prefix}us_per_call"] * 1e-6) / 1e12
    return row


def timed(fn: Callable[[int], object], min_seconds: float, min_reps: int = 5) -> tuple[float, float]:
    """(median, best) seconds of fn(i), i = 1, 2, … after one warm-up call. The median is
    the figure; the best says what the hardware does when nothing preempts the call
    (on a shared host, calls longer than a scheduler slice are often preempted)."""
    fn(0)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        fn(len(times) + 1)
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def expert_bytes(hidden: int, inter: int) -> int:
    return 3 * hidden * inter * 2  # gate, up, down in bf16


def unique_pages(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """bf16 normal values (no denormals to slow FMAs, no NaNs) tiled from one random
    block, then every 4 KiB page made unique.

    NOTE: a host (hypervisor) may merge identical pages; on the dev VM reads of merged
    pages ran at a third of the speed of distinct ones, and a kernel reading them
    looked faster than memory. Drawing random data everywhere is too slow."""
    if (need := torch.Size(shape).numel() * 2) > (free := mem_available()):  # refused: no torch traceback, no OOM kill
        raise ValueError(f"a {need / 2**30:.1f} GiB buffer does not fit the {free / 2**30:.1f} GiB of host memory "
                         "available: lower --read-gib or --pool-mib (or --hidden / --intermediate)")
    out = torch.empty(shape, dtype=torch.bfloat16)
    flat = out.view(-1)
    block = (torch.randn(1 << 20, generator=g) * 0.02).bfloat16()
    for at in range(0, flat.numel(), block.numel()):
        flat[at : at + block.numel()] = block[: flat.numel() - at]
    pages = flat[: flat.numel() // 2048 * 2048].view(-1, 2048)  # 2048 bf16 = 4 KiB
    pages[:, :16] = (torch.randn(pages.shape[0], 16, generator=g) * 0.02).bfloat16()
    return out


def expert_pool(pool_bytes: int, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Banks gate_up [E, 2I, H], down [E, H, I] of bf16 weights, pages unique."""
    count = max(2 * LAYER_EXPERTS, -(-pool_bytes // expert_bytes(hidden, inter)))
    g = torch.Generator().manual_seed(0)
    return unique_pages((count, 2 * inter, hidden), g), unique_pages((count, hidden, inter), g)


def expert_call(kernel: CpuExperts, banks: tuple[torch.Tensor, torch.Tensor], tokens: int,
                per_call: int, tables_ahead: bool = False) -> Callable[[int], None]:
    """call(i): `per_call` experts of the pool `banks`, each on all `tokens` tokens, in one
    kernel call; consecutive i rotate through the pool. Through the executors' Python
    entry point, or with `tables_ahead` the C calls alone (see `call_rates`' note)."""
    gate_up, down = banks
    count, hidden, inter = gate_up.shape[0], gate_up.shape[2], down.shape[2]
    x = torch.randn(tokens, hidden).bfloat16()
    weights = torch.ones(tokens, per_call)
    contrib = torch.zeros(tokens, per_call, hidden)
    routes = [[(i * per_call + j) % count for j in range(per_call)] for i in range(count)]
    ids = [torch.tensor(r).expand(tokens, per_call) for r in routes]
    if tables_ahead:
        tables = [bank_job_table(ids[r], weights, routes[r], routes[r], gate_up, down) for r in range(count)]
        return lambda i: kernel.call(x, tables[i % count][0], contrib.view(-1, hidden), hidden, inter)

    def call(i: int) -> None:
        r = i % count
        moe_experts_partial_cpu(x, ids[r], weights, routes[r], routes[r], gate_up, down, F.silu, contrib, kernel)

    return call


# NOTE (why two rates): the executors' Python entry point builds each call's job table
# (routing grouped, parts checked, addresses): ~200-250 µs a call of 8 experts on the GPU
# machine (scripts/cpu_phase_times.py, 2026-12-03), 38% of an int8 call. The device
# cache's CPU share builds its jobs in C (em_host.h) and pays none of it: its rate is the
# kernel's, `kernel_gb_s`, timed from job tables built beforehand.
def call_rates(call: Callable[[int], object], nbytes: int, min_seconds: float, prefix: str = "") -> dict[str, float]:
    median, best = timed(call, min_seconds)
    return {f"{prefix}us_per_call": median * 1e6, f"{prefix}gb_s": nbytes / median / 1e9,
            f"{prefix}best_gb_s": nbytes / best / 1e9}


def expert_rate(kernel: CpuExperts, banks: tuple[torch.Tensor, torch.Tensor], tokens: int, per_call: int,
                min_seconds: float) -> dict[str, float]:
    """GB/s of weights when `per_call` experts, each on all `tokens` tokens, run in one
    call: through the entry point, and (native kernels) the C calls alone (`kernel_*`)."""
    nbytes = per_call * expert_bytes(banks[0].shape[2], banks[1].shape[2])
    rates = call_rates(expert_call(kernel, banks, tokens, per_call), nbytes, min_seconds)
    if kernel.native:
        rates |= call_rates(expert_call(kernel, banks, tokens, per_call, True), nbytes, min_seconds, "kernel_")
    return rates


def quant_pool(fmt_name: str, pool_bytes: int, hidden: int, inter: int) -> list[Parts]:
    """Experts in `fmt_name` with random bytes (unique pages): int8 in [-64, 64], e4m3
    bytes of finite magnitude (no NaN), int4 / mxfp4 any nibbles with zero points in
    [0, 15], scales near 1e-3 (mxfp4: exponents near 2^-3)."""
    fmt = expert_format(fmt_name)
    count = max(2 * LAYER_EXPERTS, -(-pool_bytes // expert_nbytes(fmt, hidden, inter)))
    g = torch.Generator().manual_seed(2)
    experts = []
    for _ in range(count):
        parts: Parts = {}
        for name, (shape, dt) in expert_specs(fmt, hidden, inter).items():
            if dt in (torch.float32, torch.float16):
                parts[name] = (torch.rand(shape, generator=g) * 1e-3 + 1e-3).to(dt)
            elif name.endswith("_scale"):  # mxfp4: E8M0 exponents near 2^-3
                parts[name] = torch.randint(120, 128, shape, generator=g, dtype=dt)
            elif name.endswith("_zero"):
                parts[name] = torch.randint(0, 16, shape, generator=g, dtype=dt)
            elif dt == torch.uint8:  # int4: two nibbles a byte
                parts[name] = torch.randint(0, 256, shape, generator=g, dtype=dt)
            elif dt == torch.int8:
                parts[name] = torch.randint(-64, 65, shape, generator=g, dtype=torch.int8)
            else:  # e4m3: any byte but 0x7F / 0xFF (NaN), magnitudes below 2^6
                parts[name] = (torch.randint(0, 0x60, shape, generator=g, dtype=torch.uint8)
                               | (torch.randint(0, 2, shape, generator=g, dtype=torch.uint8) << 7)).view(dt)
        experts.append(parts)
    return experts


def quant_shape(experts: list[Parts]) -> tuple[int, int]:
    """(H, I) of a quant pool's experts. NOTE: I from gate_up's rows: int4's down holds
    ceil(I/2) bytes a row."""
    return experts[0]["down"].shape[0], experts[0]["gate_up"].shape[0] // 2


def quant_expert_call(kernel: CpuExperts, fmt_name: str, experts: list[Parts], tokens: int,
                      per_call: int, tables_ahead: bool = False) -> Callable[[int], None]:
    """`expert_call` for a pool of quantised experts in `fmt_name`."""
    fmt, count = expert_format(fmt_name), len(experts)
    hidden, inter = quant_shape(experts)
    x = torch.randn(tokens, hidden).bfloat16()
    weights, contrib = torch.ones(tokens, per_call), torch.zeros(tokens, per_call, hidden)
    routes = [[(i * per_call + j) % count for j in range(per_call)] for i in range(count)]
    ids = torch.arange(per_call).expand(tokens, per_call)
    native = native_weights(fmt)
    if tables_ahead and native:
        tables = [quant_job_table(ids, weights, list(range(per_call)), [experts[e] for e in r]) for r in routes]
        return lambda i: kernel.call(x, tables[i % count][0], contrib.view(-1, hidden), hidden, inter, *native)

    def call(i: int) -> None:
        r = routes[i % count]
        moe_experts_q_cpu(x, ids, weights, list(range(per_call)), [experts[e] for e in r], fmt, contrib, kernel)

    return call


def quant_expert_rate(kernel: CpuExperts, fmt_name: str, experts: list[Parts], tokens: int, per_call: int,
                      min_seconds: float) -> dict[str, float]:
    """`expert_rate` for quantised weights: GB/s of the format's bytes."""
    nbytes = per_call * expert_nbytes(expert_format(fmt_name), *quant_shape(experts))
    rates = call_rates(quant_expert_call(kernel, fmt_name, experts, tokens, per_call), nbytes, min_seconds)
    if kernel.native and native_weights(expert_format(fmt_name)):
        rates |= call_rates(quant_expert_call(kernel, fmt_name, experts, tokens, per_call, True), nbytes, min_seconds,
                            "kernel_")
    return rates


def torch_int8_rate(experts: list[Parts], per_call: int, hot: bool, min_seconds: float) -> dict[str, float]:
    """GB/s of int8 weights through torch's `_weight_int8pack_mm` (int8 weights × bf16
    activations, per-row scales), `per_call` experts at one token each: gate_up, SiLU·up,
    down. The yardstick PERF-NOTES quotes for the int8 target. `hot`: the same experts
    every call (they stay in the CPU's caches: an expert is 4.7 MB, the GPU machine's L3
    300 MiB), else rotating through the pool as every other row of `bench bw`."""
    count, (hidden, inter) = len(experts), quant_shape(experts)
    nbytes = expert_nbytes(expert_format("int8"), hidden, inter)
    mats = [(e["gate_up"], e["gate_up_scale"].flatten().bfloat16(), e["down"], e["down_scale"].flatten().bfloat16())
            for e in experts]
    x = torch.randn(1, hidden).bfloat16()
    mm = torch.ops.aten._weight_int8pack_mm

    def call(i: int) -> None:
        for j in range(per_call):
            gu, gs, dn, ds = mats[j if hot else (i * per_call + j) % count]
            g, u = mm(x, gu, gs).chunk(2, dim=-1)
            mm(F.silu(g) * u, dn, ds)

    return call_rates(call, per_call * nbytes, min_seconds)


def measure_torch_int8(experts: list[Parts], seconds: float) -> list[dict[str, Any]]:
    """`torch_int8_rate` rows (torch's threads), one and a layer's experts a call, from the
    pool and cache-resident."""
    rows = []
    for per_call in (1, LAYER_EXPERTS):
        for hot in (False, True):
            rate = torch_int8_rate(experts, per_call, hot, seconds)
            rows.append({"kernel": "torch-int8pack" + (" hot" if hot else ""), "weights": "int8", "tokens": 1,
                         "experts_per_call": per_call, "path": "default", "cache_resident": hot, **rate})
    return rows


def measure_quant_experts(kernels: list[CpuExperts], weights: list[str], pool_bytes: int, hidden: int, inter: int,
                          seconds: float, shapes: Sequence[tuple[int, int]] = ()) -> list[dict[str, Any]]:
    rows = []
    for fmt_name in weights:
        experts = quant_pool(fmt_name, pool_bytes, hidden, inter)
        if fmt_name == "int8" and hasattr(torch.ops.aten, "_weight_int8pack_mm"):
            rows += measure_torch_int8(experts, seconds)
        for kernel in (k for k in kernels if k.native):
            cases = [(1, 1, "default"), (8, 1, "default"), (1, LAYER_EXPERTS, "default")]
            if kernel.name in GEMM_CAPABLE:
                cases.append((32, 1, "blocked"))
            for tokens, per_call, path in cases + prompt_cases(kernel, shapes):
                saved = kernel.gemm_min_tokens
                kernel.gemm_min_tokens = 1 if path == "blocked" else saved
                rate = quant_expert_rate(kernel, fmt_name, experts, tokens, per_call, seconds)
                kernel.gemm_min_tokens = saved
                rows.append(add_tflops({"kernel": kernel.name, "weights": fmt_name, "tokens": tokens,
                                        "experts_per_call": per_call, "path": path, **rate}, hidden, inter))
    return rows


def host_read(kernel: CpuExperts, gib: float, min_seconds: float) -> dict[str, float]:
    """Read bandwidth over a `gib` GiB buffer (pages unique), timed per 32 MiB piece
    taken in turn, so no piece is re-read from cache and each timing is short enough
    to run unpreempted on a shared host; torch.sum on the same pieces."""
    piece = 32 * 2**20 // 4  # float32 elements
    buf = unique_pages((max(piece, int(gib * 2**30) // 4 // piece * piece), 2), torch.Generator().manual_seed(1))
    pieces = buf.view(torch.float32).view(-1, piece)
    nbytes = piece * 4
    read, read_best = timed(lambda i: kernel.read(pieces[i % len(pieces)]), min_seconds)
    total, total_best = timed(lambda i: pieces[i % len(pieces)].sum(), min_seconds)
    return {"kernel_read_gb_s": nbytes / read / 1e9, "kernel_read_best_gb_s": nbytes / read_best / 1e9,
            "torch_sum_gb_s": nbytes / total / 1e9, "torch_sum_best_gb_s": nbytes / total_best / 1e9}


def available_kernels(threads: int | None, requested: list[str] | None) -> list[CpuExperts]:
    names = requested or [v for v in ("amx", "avx512", "avx2") if cpu_isa.supported(v)] + ["torch"]
    kernels = []
    for name in names:
        try:
            kernels.append(CpuExperts(name, threads=threads))
        except (ValueError, RuntimeError) as e:
            print(f"  {name}: unavailable ({e})")
    if not kernels:
        raise ValueError(f"--kernels {' '.join(names)}: none of them runs here (why is above)")
    return kernels


def measure_experts(kernels: list[CpuExperts], banks: tuple[torch.Tensor, torch.Tensor], seconds: float,
                    shapes: Sequence[tuple[int, int]] = ()) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    runs = []
    for kernel in kernels:
        cases = [(1, 1, "default"), (8, 1, "default"), (32, 1, "default"), (1, LAYER_EXPERTS, "default")]
        if kernel.name in GEMM_CAPABLE:
            cases.append((8, 1, "blocked"))
        runs += [(kernel, *case) for case in cases + prompt_cases(kernel, shapes)]
    # Each case takes at least `seconds`: a bar, so the wait is visible.
    for kernel, tokens, per_call, path in tqdm(runs, desc="CPU experts", unit="case", leave=False):
        saved = kernel.gemm_min_tokens
        kernel.gemm_min_tokens = 1 if path == "blocked" else saved
        rate = expert_rate(kernel, banks, tokens, per_call, seconds)
        kernel.gemm_min_tokens = saved
        rows.append(add_tflops({"kernel": kernel.name, "tokens": tokens, "experts_per_call": per_call, "path": path,
                                **rate}, banks[0].shape[2], banks[1].shape[2]))
    return rows


def _label(row: dict[str, Any]) -> str:
    what = f"{row['experts_per_call']}×n=1 layer" if row["experts_per_call"] > 1 else f"n={row['tokens']}"
    if row["experts_per_call"] > 1 and row["tokens"] > 1:
        what = f"{row['experts_per_call']}×n={row['tokens']} prompt"
    weights = f" {row['weights']}" if row.get("weights", "bf16") != "bf16" else ""
    return f"{row['kernel']}{weights} {what}" + (" blocked" if row["path"] == "blocked" else "")


def run_bw_bench(args: argparse.Namespace) -> int:
    kernels = available_kernels(args.threads, args.kernels)
    native = next((k for k in kernels if k.native), kernels[0])
    counters = host_counters()
    read = host_read(native, args.read_gib, args.seconds)
    print(f"host read: {read['kernel_read_gb_s']:.1f} GB/s, best {read['kernel_read_best_gb_s']:.1f} ({native.name} "
          f"pool, {native.threads} threads); torch.sum {read['torch_sum_gb_s']:.1f} GB/s ({torch.get_num_threads()} threads)")
    banks = expert_pool(args.pool_mib * 2**20, args.hidden, args.intermediate)
    nbytes = expert_bytes(args.hidden, args.intermediate)
    rows = measure_experts(kernels, banks, args.seconds, args.prompt_shapes)
    quant = [w for w in (args.weights or []) if w != "bf16"]
    rows += measure_quant_experts(kernels, quant, args.pool_mib * 2**20, args.hidden, args.intermediate, args.seconds,
                                  args.prompt_shapes)
    print(f"CPU experts, H={args.hidden} I={args.intermediate} ({nbytes / 1e6:.2f} MB bf16): GB/s of weights in their "
          f"format through the executors' entry point (median, % of host read; best, % of best read), then the C "
          f"calls alone (kernel: what the device cache's CPU share gets)")
    for row in rows:
        row["ratio_to_read"] = row["gb_s"] / read["kernel_read_gb_s"]
        row["best_ratio_to_best_read"] = row["best_gb_s"] / read["kernel_read_best_gb_s"]
        kernel = f"   kernel {row['kernel_gb_s']:7.1f} ({row['kernel_us_per_call']:.0f} µs)" if "kernel_gb_s" in row else ""
        if row["tokens"] > 1:
            kernel += f"   {row.get('kernel_tflops', row['tflops']):.2f} TFLOP/s"
        print(f"  {_label(row):26s} {row['gb_s']:7.1f} {row['ratio_to_read']:6.1%}   {row['best_gb_s']:7.1f} "
              f"{row['best_ratio_to_best_read']:6.1%}   {row['us_per_call']:8.0f} µs/call{kernel}")
    copies = copy_rates(min(args.pool_mib * 2**20, 2**30), nbytes) if torch.cuda.is_available() else {}
    for key, value in copies.items():
        print(f"  {key}: {value:.1f}")
    host = counters_delta(counters, host_counters())
    if note := disturbance(host):  # steal alone: torch's threads beside the pool's outnumber the cores by design
        print(note)
    payload = {
        "threads": native.threads, "torch_threads": torch.get_num_threads(), "physical_cores": cpu_isa.physical_cores(),
        "auto_kernel": CpuExperts("auto", threads=1).name,
        "hidden": args.hidden, "intermediate": args.intermediate, "expert_bytes": nbytes,
        "host": read, "experts": rows, "copies": copies, "host_counters": host, **({"host_note": note} if note else {}),
    }
    path = write_result(args.out, "bw", payload)
    marks = {"host read": read["kernel_read_gb_s"]}
    for key, mark in (("h2d_pinned_expert_gb_s", "pinned H2D (expert)"), ("h2d_gather_expert_gb_s", "gather H2D (expert)")):
        if key in copies:
            marks[mark] = copies[key]
    bars = {_label(r): r["gb_s"] for r in rows} | {f"{_label(r)} (C calls)": r["kernel_gb_s"] for r in rows
                                                   if "kernel_gb_s" in r}
    png = plot_bars(path, "edgemoe bench bw: CPU experts", "GB/s of weights (format bytes)", bars, marks)
    print(f"wrote {path} and {png}")
    return 0
