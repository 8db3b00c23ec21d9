"""`plan_speed`'s constants fitted to `bench decode` results, and the model checked on them.

`RUNS` names the calibration runs (bench/results/, one H200, 2026-12-01): each run's
preset, expert format, memory and plan settings are the inputs `edgemoe plan` takes; its
measured misses per token and ms per step are read from the result file. `fit()` derives
every constant of `plan_speed` from those files (docs/plan.md gives the order);
`plan_args()` is the `edgemoe plan` command line that predicts a run from its misses.

    python -m edgemoe.bench.plan_fit [--results bench/results]   # the constants and the table
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from edgemoe import plan_speed as speed

QWEN3 = "random:qwen3-30b-a3b"
BW_JSON = "bw-20261201-150027.json"


# Every run below predates the slot pool's tail lent to long chunks (2026-12-03): the plan
# predicts them without it, as they ran.
UNLENT = (("EDGEMOE_LEND_SLOTS", "0"),)


class Run(NamedTuple):
    label: str
    file: str  # under the results directory
    preset: str
    fmt: str
    gpu_memory: str
    context: int  # prompt tokens: the KV a decode step reads
    plan_flags: tuple[str, ...]  # the run's engine settings, as `edgemoe plan` flags
    env: tuple[tuple[str, str], ...] = UNLENT  # the engine's environment that the plan reads too


class Measured(NamedTuple):
    step_ms: float  # p50 ms per decode step (a .jsonl row has only tok/s: its mean)
    misses: float  # decode misses per token
    slots: int  # the engine's slots (0: resident)
    prefill_tok_s: float  # the prompt's prefill, one chunk of `context` tokens (synthetic routing's host draws excluded)


KV8K = ("--kv-tokens", "8192")
# Runs from before streamed prefill (2026-12-02) planned every prompt chunk's misses: the
# plan predicts them with streaming off, as the engine now runs with this setting.
PLANNED = (("EDGEMOE_PREFILL_STREAM_TOKENS", "0"), *UNLENT)
RESIDENT = ("--moe-backend", "resident")
RUNS = (
    Run("1 bf16 16 GiB", "decode-20261201-204535.json", QWEN3, "bf16", "16GiB", 1024, KV8K),
    Run("2 fp8 16 GiB", "decode-20261201-204603.json", QWEN3, "fp8", "16GiB", 1024, KV8K),
    Run("3 bf16 8 GiB", "decode-20261201-204633.json", QWEN3, "bf16", "8GiB", 1024, KV8K),
    Run("4 int4 8 GiB", "decode-20261201-204659.json", QWEN3, "int4", "8GiB", 1024, KV8K),
    Run("5 bf16 16 GiB synthetic", "decode-20261201-204237.json", QWEN3, "bf16", "16GiB", 1024, KV8K, PLANNED),
    Run("6a resident 1K", "decode-20261201-204102.json", QWEN3, "bf16", "140GiB", 1024, RESIDENT),
    Run("6b resident 32K", "decode-20261201-204346.json", QWEN3, "bf16", "140GiB", 32768, RESIDENT),
    Run("7 qwen3.5 16 GiB", "decode-20261201-204835.json", "random:qwen3.5-35b-a3b", "bf16", "16GiB", 1024,
        ("--kv-tokens", "40960", "--max-prefill-tokens", "8192")),
    Run("8 qwen3.8 16 GiB 32K", "qwen4-20261201-204900-host-embed-device.jsonl", "random:qwen3.8-flash-next", "bf16",
        "16GiB", 32768, ("--kv-tokens", "131200", "--max-model-len", "131200", "--max-running-requests", "4")),
    # Issue 17's checks: made after the constants were committed (23:53-23:55 UTC, PDL on by default).
    Run("9 check bf16 16 GiB", "decode-20261201-235358.json", QWEN3, "bf16", "16GiB", 1024, KV8K),
    Run("10 check fp8 16 GiB", "decode-20261201-235424.json", QWEN3, "fp8", "16GiB", 1024, KV8K),
    Run("11 check bf16 8 GiB", "decode-20261201-235501.json", QWEN3, "bf16", "8GiB", 1024, KV8K),
    Run("12 check bf16 16 GiB synthetic", "decode-20261201-234509.json", QWEN3, "bf16", "16GiB", 1024, KV8K, PLANNED),
    # Streamed prefill (2026-12-02): the 8K prompt in one chunk; its decode is 8 tokens, not fitted.
    Run("13 streamed 8K", "decode-20261202-103747.json", QWEN3, "bf16", "16GiB", 8192,
        ("--kv-tokens", "40960", "--max-prefill-tokens", "8192")),
)
# The runs whose prefill the plan's prefill model describes: a chunk that touches every expert, as
# uniform or realistic routing does (synthetic routing); the random presets' router concentrates a
# chunk on a few experts (run 1's 1K prefill missed 1.3 experts a token, not 4.8), so its runs can't.
PREFILL_RUNS = ("5", "12", "13")
DECODE_RUNS = tuple(r for r in RUNS if not r.label.startswith("13 "))  # the step model's runs


def measured(run: Run, results: Path) -> Measured:
    """The run's batch-1 row at its context."""
    path = results / run.file
    if path.suffix == ".jsonl":  # scripts/gpu_qwen4_bench.py: one row per context
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        row = next(r for r in rows if r["context"] == run.context)
        return Measured(1000 / row["decode_tok_s"], row["misses_per_token"], row["slots"], row["prefill_tok_s"])
    data = json.loads(path.read_text())
    row = next(r for r in data["rows"] if r["prompt_tokens"] == run.context and r["batch"] == 1)
    prefill = row.get("prefill_tok_s_without_draws", row["prefill_tok_s"])  # runs before 2026-12-02 counted them
    return Measured(row["decode_step_ms_p50"], row["decode_moe"]["misses_per_token"], data["moe"].get("slots", 0),
                    prefill)


def plan_args(run: Run, results: Path, misses: float) -> list[str]:
    """`edgemoe plan` for the run, given its measured misses and the machine's `bench bw` rates."""
    return ["plan", "--model", run.preset, "--gpu-memory", run.gpu_memory, "--formats", run.fmt,
            "--context-tokens", str(run.context), "--misses-per-token", repr(misses),
            "--bw-json", str(results / BW_JSON),
            "--embed-weights", "device",  # as every run planned it (before --embed-weights auto, 2026-12-07)
            *run.plan_flags]


def fit(results: Path) -> dict[str, float]:
    """Every constant of `plan_speed`, from the runs, in dependency order:
    KV_EFFICIENCY and bf16's from 6a/6b; SLOT_CACHE_US from 1 against 6a and COPY_EFFICIENCY
    pooled over 3 and 5 (solved together: run 1's copies need the copy efficiency, the
    copy-bound runs' base the slot cost); fp8's and int4's from 2 and 4 given the rest;
    PREFILL_EFFICIENCY from 5's prefill against the plan's prefill bound, STREAM_EFFICIENCY
    from 13's streamed chunk against `prefill_streamed`."""
    from edgemoe.engine.budget import expert_nbytes
    from edgemoe.plan import _model
    from edgemoe.quant import expert_format

    cal = speed.CALIBRATION
    rate = cal.device_gbps * speed.GB / 1000  # bytes per ms
    by = {r.label.split()[0]: r for r in RUNS}
    arch = _model(QWEN3)[1]
    e = {f: expert_nbytes(arch, expert_format(f)) for f in ("bf16", "fp8", "int4")}
    m = {k: measured(r, results) for k, r in by.items()}
    b1k, b32k = (speed.step_bytes(arch, e["bf16"], by[k].context) for k in ("6a", "6b"))
    kv_eff = (b32k.kv - b1k.kv) / (rate * (m["6b"].step_ms - m["6a"].step_ms))
    kv_ms = b1k.kv / (rate * kv_eff)
    bf16_eff = (b1k.dense + b1k.experts) / (rate * (m["6a"].step_ms - kv_ms))
    layers, copy_eff, slot_ms = len(arch.moe_layers), 1.0, 0.0
    for _ in range(50):  # a fixed point: run 1's copies are ~4% of its step
        slot_ms = m["1"].step_ms - m["6a"].step_ms - m["1"].misses * e["bf16"] / (cal.pcie_gbps * copy_eff * 1e6)
        base = m["6a"].step_ms + slot_ms
        moved = sum(m[k].misses * e["bf16"] for k in ("3", "5"))
        copy_eff = moved / (sum(m[k].step_ms - base for k in ("3", "5")) * cal.pcie_gbps * 1e6)
    dense_ms = b1k.dense / (rate * bf16_eff)
    out_prefill = m["5"].prefill_tok_s / (predicted_prefill(by["5"], results) / speed.PREFILL_EFFICIENCY)
    out = {"bf16": bf16_eff, "KV_EFFICIENCY": kv_eff, "SLOT_CACHE_US": 1000 * slot_ms / layers,
           "COPY_EFFICIENCY": copy_eff}
    for k, fmt in (("2", "fp8"), ("4", "int4")):
        b = speed.step_bytes(arch, e[fmt], by[k].context)
        copies = m[k].misses * e[fmt] / (cal.pcie_gbps * copy_eff * 1e6)
        out[fmt] = b.experts / (rate * (m[k].step_ms - dense_ms - b.kv / (rate * kv_eff) - slot_ms - copies))
    out["PREFILL_EFFICIENCY"] = out_prefill
    out["STREAM_EFFICIENCY"] = m["13"].prefill_tok_s / (predicted_prefill(by["13"], results) / speed.STREAM_EFFICIENCY)
    return out


@contextmanager
def run_env(run: Run) -> Iterator[None]:
    """The run's engine environment while the plan predicts it."""
    saved = {k: os.environ.get(k) for k, _ in run.env}
    os.environ.update(dict(run.env))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def predicted_ms(run: Run, results: Path, misses: float) -> float:
    """The run's ms per step as `edgemoe plan` predicts it (its own code path) from `misses`."""
    from edgemoe.cli import build_parser
    from edgemoe.plan import plan_rows

    with run_env(run):
        _, _, _, rows = plan_rows(build_parser().parse_args(plan_args(run, results, misses)))
    step = rows[0].step
    assert step is not None, "the bw result gives both rates"
    return step.total_ms


def predicted_prefill(run: Run, results: Path) -> float:
    """The run's prefill tok/s as `edgemoe plan` predicts it: one chunk of the run's prompt."""
    from edgemoe.cli import build_parser
    from edgemoe.plan import plan_rows

    args = [*plan_args(run, results, 0.0), "--max-prefill-tokens", str(run.context)]
    with run_env(run):
        prefill = plan_rows(build_parser().parse_args(args))[3][0].prefill
    assert prefill is not None, "the bw result gives the PCIe rate"
    return prefill


def table(results: Path) -> list[tuple[Run, Measured, float]]:
    """(run, measured, predicted ms per step from its measured misses) per run."""
    return [(run, got, predicted_ms(run, results, got.misses)) for run in DECODE_RUNS
            for got in [measured(run, results)]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="bench/results", help="the directory holding the calibration runs' files")
    results = Path(ap.parse_args().results)
    if not results.is_dir():
        ap.error(f"--results {results}: no such directory")
    if missing := sorted({run.file for run in RUNS if not (results / run.file).is_file()} | (
            set() if (results / BW_JSON).is_file() else {BW_JSON})):
        ap.error(f"--results {results}: the calibration runs' files are missing: {', '.join(missing)}")
    for name, value in fit(results).items():
        print(f"{name:<16} {value:.4f}")
    print("\n| run | file | misses / token | measured ms | predicted ms | error |\n|---|---|---|---|---|---|")
    for run, got, predicted in table(results):
        print(f"| {run.label} | `{run.file}` | {got.misses:.2f} | {got.step_ms:.2f} | {predicted:.2f} | "
              f"{predicted / got.step_ms - 1:+.1%} |")
    print("\n| run | prefill tok/s measured | predicted | error |\n|---|---|---|---|")
    for run in (r for r in RUNS if r.label.split()[0] in PREFILL_RUNS):
        got, predicted = measured(run, results).prefill_tok_s, predicted_prefill(run, results)
        print(f"| {run.label} | {got:,.1f} | {predicted:,.1f} | {predicted / got - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
