"""`edgemoe plan`: the bound formulas against PERF-NOTES' worked numbers, the hit-rate model's
limits, the engine's own memory plan, and rates read from a `bench bw` result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgemoe.cli import build_parser, main
from edgemoe.plan import (
    DECODE_EFFICIENCY,
    FORMATS,
    decode_bound,
    hit_rate,
    prefill_bound,
    rates_from,
)

EXPERT_BF16 = 3 * 2048 * 768 * 2  # one Qwen3-30B-A3B expert: 9.44 MB


def test_decode_bound_matches_the_worked_example() -> None:
    # PERF-NOTES: 384 expert uses per token, B_pcie 52.6 GB/s, h = 0.2 → "~18 tok/s copy-only".
    bound = decode_bound(52.6, (1 - 0.2) * 384, EXPERT_BF16)
    assert bound == pytest.approx(52.6e9 / (0.8 * 384 * EXPERT_BF16))
    assert 17.5 < bound < 18.5
    # fp8 halves the bytes: twice the bound ("fp8 doubles both").
    assert decode_bound(52.6, 0.8 * 384, EXPERT_BF16 // 2) == pytest.approx(2 * bound)


def test_prefill_bound_counts_touched_experts() -> None:
    # A long chunk touches every expert: tok/s = chunk × B / (layers × E × bytes).
    long = prefill_bound(52.6, 8192, 48, 128, 8, 0.0, EXPERT_BF16)
    assert long == pytest.approx(8192 * 52.6e9 / (48 * 128 * EXPERT_BF16), rel=1e-6)
    # 10 tokens touch 1 − (1 − 8/128)^10 = 47.6% of each layer ("48% at 10 tokens").
    short = prefill_bound(52.6, 10, 48, 128, 8, 0.0, EXPERT_BF16)
    touched = 10 * 52.6e9 / (48 * 128 * EXPERT_BF16) / short
    assert touched == pytest.approx(1 - (1 - 8 / 128) ** 10)
    assert prefill_bound(52.6, 8192, 48, 128, 8, 1.0, EXPERT_BF16) == float("inf")  # all resident


def test_hit_rate_model_limits() -> None:
    assert hit_rate(1000, 6144, 384, 0.0) == pytest.approx(1000 / 6144)  # uniform: the slot share
    assert hit_rate(1000, 6144, 384, 1.0) == 1.0  # all reuse, and a token's experts fit
    assert hit_rate(192, 6144, 384, 1.0) == pytest.approx(0.5)  # half a token's experts fit
    assert hit_rate(6144, 6144, 384, 0.3) == 1.0


def test_plan_slots_are_the_engines_plan(capsys, tmp_path: Path) -> None:  # noqa: ANN001
    from edgemoe.engine.budget import parse_size, plan_memory
    from edgemoe.models.presets import parse_random
    from edgemoe.models.registry import model_module

    model = "random:qwen3-30b-a3b"
    assert main(["plan", "--model", model, "--gpu-memory", "16GiB", "--pcie-gbps", "50", "--cpu-gbps", "30",
                 "--bench-dir", str(tmp_path), "--formats", "bf16", "fp8"]) == 0
    out = capsys.readouterr().out
    spec = parse_random(model)
    arch = model_module(spec.config["model_type"]).arch(spec.config)
    engine = plan_memory(arch, backend="auto", moe_slots=None, kv_tokens=None, max_model_len=arch.max_position_embeddings,
                         max_prefill_tokens=2048, max_running=64, budget=parse_size("16GiB"), context=parse_size("0.5GiB"),
                         graph_max_bs=32)
    bf16 = next(line for line in out.splitlines() if line.startswith("bf16"))
    assert f" {engine.num_slots} " in bf16 and engine.backend in bf16
    h = engine.num_slots / (48 * 128)
    predicted = DECODE_EFFICIENCY * decode_bound(50, (1 - h) * 384, EXPERT_BF16)
    assert f" {predicted:.1f} " in bf16
    assert "PLACEHOLDER" in out  # the efficiency is not calibrated yet, and it says so
    assert FORMATS["bf16"] == 2.0


def test_rates_from_the_newest_bw_result(tmp_path: Path) -> None:
    old = {"host": {"kernel_read_gb_s": 1.0}, "experts": [], "copies": {"h2d_pinned_expert_gb_s": 1.0}}
    new = {"host": {"kernel_read_gb_s": 90.0},
           "experts": [{"tokens": 1, "experts_per_call": 8, "gb_s": 33.0}, {"tokens": 1, "experts_per_call": 8, "gb_s": 41.0},
                       {"tokens": 32, "experts_per_call": 1, "gb_s": 80.0}],
           "copies": {"h2d_pinned_expert_gb_s": 52.6}}
    (tmp_path / "bw-20260101-000000.json").write_text(json.dumps(old))
    (tmp_path / "bw-20261201-120000.json").write_text(json.dumps(new))
    args = build_parser().parse_args(["plan", "--gpu-memory", "16GiB", "--bench-dir", str(tmp_path)])
    rates = rates_from(args)
    assert (rates.pcie_gbps, rates.cpu_gbps, rates.host_read_gbps) == (52.6, 41.0, 90.0)  # batch-1 layer rows only
    given = rates_from(build_parser().parse_args(["plan", "--gpu-memory", "8GiB", "--bench-dir", str(tmp_path),
                                                  "--pcie-gbps", "25"]))
    assert given.pcie_gbps == 25 and given.cpu_gbps == 41.0
