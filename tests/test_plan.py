"""`edgemoe plan`: the bound formulas against PERF-NOTES' worked numbers, the hit-rate model's
limits, the engine's own memory plan, rates read from a `bench bw` result, and the speed
model against the GPU runs it was calibrated on (bench/results/, within issue 17's 15%)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgemoe import plan_speed as speed
from edgemoe.bench.plan_fit import PREFILL_RUNS, RUNS, fit, measured, plan_args, predicted_ms, predicted_prefill, run_env
from edgemoe.cli import build_parser, main
from edgemoe.plan import FORMATS, hit_rate, plan_rows, rates_from
from edgemoe.plan_speed import decode_bound, prefill_bound, prefill_streamed

EXPERT_BF16 = 3 * 2048 * 768 * 2  # one Qwen3-30B-A3B expert: 9.44 MB
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


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


def test_streamed_prefill_copies_every_expert_not_held_after_the_loan() -> None:
    # 1,172 slots lend 2 x 128 and keep 916 experts: the chunk copies the other 6,144 - 916.
    got = prefill_streamed(52.6, 8192, 48, 128, 1172, EXPERT_BF16)
    assert got == pytest.approx(8192 * 52.6e9 / ((48 * 128 - 916) * EXPERT_BF16), rel=1e-9)
    assert prefill_streamed(52.6, 8192, 48, 128, 256, EXPERT_BF16) == pytest.approx(
        8192 * 52.6e9 / (48 * 128 * EXPERT_BF16), rel=1e-9)  # every slot lent: nothing held
    assert prefill_streamed(52.6, 8192, 1, 128, 10_000, EXPERT_BF16) == float("inf")  # all held


def test_plan_streams_where_the_engine_would(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.plan import streams

    monkeypatch.delenv("EDGEMOE_PREFILL_STREAM_TOKENS", raising=False)
    assert streams(1024, 256, 128) and not streams(1023, 256, 128) and not streams(8192, 255, 128)
    monkeypatch.setenv("EDGEMOE_PREFILL_STREAM_TOKENS", "0")
    assert not streams(8192, 1172, 128)


def test_hit_rate_model_limits() -> None:
    assert hit_rate(1000, 6144, 384, 0.0, 8) == pytest.approx(1000 / 6144)  # uniform: the slot share
    assert hit_rate(1000, 6144, 384, 1.0, 8) == 1.0  # all reuse, and a token's experts fit
    # half a token's experts fit: the scan-resistant LRU keeps all but one layer's 8 of the cycle
    assert hit_rate(192, 6144, 384, 1.0, 8) == pytest.approx((192 - 8) / 384)
    assert hit_rate(192, 6144, 384, 0.5, 8) == pytest.approx(0.5 * (192 - 8) / 384 + 0.5 * 192 / 6144)
    assert hit_rate(8, 6144, 384, 1.0, 8) == 0.0  # a pool of one layer's experts: nothing kept
    assert hit_rate(6144, 6144, 384, 0.3, 8) == 1.0


def test_hit_rate_model_is_the_replays_floor_below_the_working_set() -> None:
    """The model's reuse hits below a token's working set against the policy itself: a
    repeating routing of 12 layers x top-4 replayed through the real `SlotCache`."""
    from edgemoe.moe.replay import replay_policy
    from edgemoe.moe.routing_trace import Access

    layers, top_k = 12, 4
    trace = [Access(layer, tuple(range(layer % 3, layer % 3 + top_k))) for _ in range(10) for layer in range(layers)]
    for slots in (12, 30, 47):
        replayed = replay_policy(trace, slots, layers, top_k + 3, "lru").hit_rate
        model = hit_rate(slots, layers * 128, layers * top_k, 1.0, top_k)
        # the model is the floor; Belady (which the replay equals here) keeps up to ~1 layer more
        assert model <= replayed <= model + top_k / (layers * top_k), (slots, model, replayed)


@pytest.mark.parametrize("run", RUNS, ids=[r.label for r in RUNS])
def test_speed_model_reproduces_each_gpu_run(run) -> None:
    # Inputs: the preset's config, the format, the memory and settings, the run's measured
    # misses and the machine's `bench bw` rates; output against the run's measured ms per step.
    got = measured(run, RESULTS)
    predicted = predicted_ms(run, RESULTS, got.misses)
    assert predicted == pytest.approx(got.step_ms, rel=0.15)  # issue 17's bar


@pytest.mark.parametrize("run", [r for r in RUNS if r.label.split()[0] in PREFILL_RUNS], ids=lambda r: r.label)
def test_prefill_model_reproduces_each_realistic_routing_run(run) -> None:
    # A 1K prompt in one chunk: the plan's prefill bound x its efficiency against the measured prefill.
    assert predicted_prefill(run, RESULTS) == pytest.approx(measured(run, RESULTS).prefill_tok_s, rel=0.15)


def test_committed_constants_are_the_fit_of_the_committed_runs() -> None:
    fitted = fit(RESULTS)
    committed = {**speed.EXPERT_EFFICIENCY, "KV_EFFICIENCY": speed.KV_EFFICIENCY,
                 "SLOT_CACHE_US": speed.SLOT_CACHE_US, "COPY_EFFICIENCY": speed.COPY_EFFICIENCY,
                 "PREFILL_EFFICIENCY": speed.PREFILL_EFFICIENCY, "STREAM_EFFICIENCY": speed.STREAM_EFFICIENCY}
    assert fitted.keys() == committed.keys()
    for name, value in committed.items():
        assert value == pytest.approx(fitted[name], rel=2e-3), name  # the code keeps 4 significant digits


def test_plan_slots_track_the_engines_measured_slots() -> None:
    # The plan estimates the CUDA context (0.5 GiB) where the engine measured it: the slots left
    # differ by what the two contexts differ, under a tenth on these runs.
    for run in RUNS[:5]:
        with run_env(run):  # as it ran: before long chunks borrowed from the slots
            _, _, _, rows = plan_rows(build_parser().parse_args(plan_args(run, RESULTS, 0.0)))
        assert rows[0].num_slots == pytest.approx(measured(run, RESULTS).slots, rel=0.1), run.label


def test_base_step_scales_with_the_device_bandwidth_and_copies_with_pcie() -> None:
    args = ["plan", "--model", "random:qwen3-30b-a3b", "--gpu-memory", "16GiB", "--formats", "bf16", "fp8",
            "--misses-per-token", "100", "--cpu-gbps", "30"]
    fast = plan_rows(build_parser().parse_args([*args, "--device-gbps", "4000", "--pcie-gbps", "50"]))[3]
    slow = plan_rows(build_parser().parse_args([*args, "--device-gbps", "1000", "--pcie-gbps", "25"]))[3]
    latency = speed.SLOT_CACHE_US * 48 / 1000  # the slot cache's bookkeeping: not a bandwidth
    for f, s in zip(fast, slow):
        assert f.step is not None and s.step is not None
        assert s.step.base_ms - latency == pytest.approx(4 * (f.step.base_ms - latency))
        assert s.step.copy_ms == pytest.approx(2 * f.step.copy_ms)
        assert f.misses_per_token == 100


def test_plan_prints_its_predictions_and_their_provenance(capsys, tmp_path: Path) -> None:
    argv = ["plan", "--model", "random:qwen3-30b-a3b", "--gpu-memory", "16GiB", "--pcie-gbps", "50",
            "--cpu-gbps", "30", "--device-gbps", "1000", "--bench-dir", str(tmp_path), "--formats", "bf16", "int8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    _, _, _, rows = plan_rows(build_parser().parse_args(argv))
    for r in rows:
        line = next(line for line in out.splitlines() if line.startswith(r.fmt))
        assert f" {r.num_slots} " in line and f" {r.step.tok_s:.1f} " in line  # type: ignore[union-attr]
    assert "measured   the decode step given its misses" in out
    assert "hit-rate model, not calibrated" in out and "int8 (as fp8)" in out
    assert "streamed when >= 1,024 tokens" in out and "else the copy bound x 0.56" in out  # both prefill models
    assert "copy+CPU (uncalibrated" in out  # the CPU share


def test_misses_out_of_range_are_refused() -> None:
    args = build_parser().parse_args(["plan", "--gpu-memory", "16GiB", "--model", "random:qwen3-30b-a3b",
                                      "--misses-per-token", "385"])
    with pytest.raises(ValueError, match="between 0 and 384"):
        plan_rows(args)


def test_rates_from_the_newest_bw_result(tmp_path: Path) -> None:
    old = {"host": {"kernel_read_gb_s": 1.0}, "experts": [], "copies": {"h2d_pinned_expert_gb_s": 1.0}}
    new = {"env": {"gpu": "NVIDIA H200"}, "host": {"kernel_read_gb_s": 90.0},
           "experts": [{"tokens": 1, "experts_per_call": 8, "gb_s": 33.0}, {"tokens": 1, "experts_per_call": 8, "gb_s": 41.0},
                       {"tokens": 32, "experts_per_call": 1, "gb_s": 80.0}],
           "copies": {"h2d_pinned_expert_gb_s": 52.6, "d2d_1GiB_gb_s": 2000.0}}
    (tmp_path / "bw-20260101-000000.json").write_text(json.dumps(old))
    (tmp_path / "bw-20261201-120000.json").write_text(json.dumps(new))
    args = build_parser().parse_args(["plan", "--gpu-memory", "16GiB", "--bench-dir", str(tmp_path)])
    rates = rates_from(args)
    assert (rates.pcie_gbps, rates.cpu_gbps, rates.host_read_gbps) == (52.6, 41.0, 90.0)  # batch-1 layer rows only
    assert (rates.device_gbps, rates.gpu) == (4000.0, "NVIDIA H200")  # a d2d copy reads and writes each byte
    given = rates_from(build_parser().parse_args(["plan", "--gpu-memory", "8GiB", "--bench-dir", str(tmp_path),
                                                  "--pcie-gbps", "25", "--device-gbps", "960"]))
    assert given.pcie_gbps == 25 and given.cpu_gbps == 41.0 and given.device_gbps == 960 and given.gpu is None


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_plan_fit_names_a_results_directory_it_cannot_use(where: str, tmp_path, monkeypatch, capsys) -> None:
    """`python -m edgemoe.bench.plan_fit --results DIR`: no directory, or one without the
    calibration runs, is a usage error naming the flag (and the files), not a traceback."""
    from edgemoe.bench import plan_fit

    results = tmp_path / "nothing" if where == "missing" else tmp_path
    monkeypatch.setattr("sys.argv", ["plan_fit", "--results", str(results)])
    with pytest.raises(SystemExit) as exit_:
        plan_fit.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--results {results}" in err
    assert ("no such directory" in err) if where == "missing" else (plan_fit.BW_JSON in err)


@pytest.mark.parametrize("backend", ["auto", "offload"])
def test_a_hybrid_without_attention_layers_is_planned(backend: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every layer linear attention (layer_types, or a full_attention_interval past the layers):
    no KV a token, which was a ZeroDivisionError in the plan (transformers runs such a model)."""
    from edgemoe.engine.model_source import parse_random

    config = {k: v for k, v in parse_random("random:tiny-qwen3.5-moe").config.items() if k != "seed"}
    config["layer_types"] = ["linear_attention"] * config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model", str(tmp_path), "--gpu-memory", "16GiB", "--moe-backend", backend]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_layer_count_past_any_model_is_refused_at_once(capsys) -> None:  # noqa: ANN001
    """A typo's million layers planned for minutes (quadratic lookups); now refused by name."""
    from edgemoe.models.hf_config import MAX_LAYERS

    rc = main(["plan", "--gpu-memory", "16GiB", "--model", f"random:qwen3-30b-a3b?num_hidden_layers={MAX_LAYERS + 1}"])
    assert rc != 0
    assert f"num_hidden_layers={MAX_LAYERS + 1}: expected at most {MAX_LAYERS}" in capsys.readouterr().err


def _checkpoint_dir(tmp_path: Path, quantization_config: dict | None) -> Path:
    """A model directory holding only config.json: qwen3-30b-a3b's, quantised as said."""
    from edgemoe.engine.model_source import parse_random

    config = {k: v for k, v in parse_random("random:qwen3-30b-a3b").config.items() if k != "seed"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


FP8_BLOCK_64 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [64, 64]}
GPTQ_GROUP_32 = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}


@pytest.mark.parametrize(("qc", "own"), [(FP8_BLOCK_64, "fp8"), (GPTQ_GROUP_32, "int4")], ids=["fp8", "gptq"])
def test_plan_sizes_experts_as_the_engine_loads_the_checkpoint(qc: dict, own: str, tmp_path: Path) -> None:
    """Each row's format is resolved against the checkpoint's quantization_config as the engine
    resolves --expert-dtype: the checkpoint's own kind keeps its block / group size (its scales)."""
    from edgemoe.engine.budget import expert_nbytes
    from edgemoe.models.quant_load import checkpoint_scheme
    from edgemoe.quant import expert_format, resolve_expert_format

    model = _checkpoint_dir(tmp_path, qc)
    stored = checkpoint_scheme(json.loads((model / "config.json").read_text()), model / "config.json").format
    _, arch, _, rows = plan_rows(build_parser().parse_args(["plan", "--model", str(model), "--gpu-memory", "16GiB"]))
    for r in rows:
        assert r.expert_bytes == expert_nbytes(arch, resolve_expert_format(r.fmt, stored, arch.dtype)), r.fmt
        assert r.auto == (r.fmt == own), r.fmt
    row = next(r for r in rows if r.fmt == own)
    assert row.expert_bytes == expert_nbytes(arch, stored)
    assert row.expert_bytes > expert_nbytes(arch, expert_format(own, arch.dtype))  # smaller blocks: more scales


def test_plan_marks_the_format_auto_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _checkpoint_dir(tmp_path, FP8_BLOCK_64)
    assert main(["plan", "--model", str(model), "--gpu-memory", "16GiB", "--bench-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    firsts = [line.split(" ", 1)[0] for line in out.splitlines()]
    assert [f for f in firsts if f.rstrip("*") in FORMATS] == ["bf16", "fp8*", "int8", "int4", "mxfp4"]
    assert ("experts    fp8 checkpoint: --expert-dtype auto (the default; the row marked *) loads the experts in "
            "fp8 e4m3 (64x64 blocks)") in out
    assert main(["plan", "--model", "random:tiny-qwen3-moe", "--gpu-memory", "16GiB", "--bench-dir", str(tmp_path),
                 "--formats", "bf16", "fp8"]) == 0
    out = capsys.readouterr().out  # a random preset: unquantised, auto keeps the model's dtype
    assert "\nbf16*" in out and "\nfp8 " in out and "keeps the experts in the model's dtype (bfloat16)" in out
    assert main(["plan", "--model", str(model), "--gpu-memory", "16GiB", "--bench-dir", str(tmp_path),
                 "--formats", "int4"]) == 0
    assert "(the default; not among --formats) loads the experts in fp8" in capsys.readouterr().out


@pytest.mark.parametrize(("qc", "said"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes' is not supported"),
    ({"quant_method": "fp8", "weight_block_size": [0, 0]}, "weight_block_size [0, 0]"),
], ids=["unsupported", "malformed"])
def test_a_quantization_config_plan_cannot_read_is_a_clean_error(qc: dict, said: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = _checkpoint_dir(tmp_path, qc)
    assert main(["plan", "--model", str(model), "--gpu-memory", "16GiB"]) != 0
    err = capsys.readouterr().err
    assert f"edgemoe plan: error: {model / 'config.json'}: " in err and said in err
    assert "Traceback" not in err


def _published_dir(tmp_path: Path, preset: str, qc: dict, text_config: bool = False) -> Path:
    """config.json as published: the preset's, its quantization_config at the top or, as
    Qwen3.5's multimodal checkpoints hold it, inside `text_config`."""
    from edgemoe.engine.model_source import parse_random

    config = {k: v for k, v in parse_random(f"random:{preset}").config.items() if k != "seed"}
    if text_config:
        config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                  "text_config": config | {"quantization_config": qc}, "vision_config": {"depth": 27}}
    else:
        config["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


_CT_W = {"actorder": None, "block_structure": None, "dynamic": False, "observer": "minmax", "symmetric": True}
_CT_IN_FP8 = {"dynamic": True, "num_bits": 8, "strategy": "token", "symmetric": True, "type": "float"}


def _ct(fmt: str, weights: dict, inputs: dict | None = None) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": _CT_W | weights,
                                          "input_activations": inputs, "output_activations": None}},
            "ignore": ["lm_head", "model.layers.0.mlp.gate"], "kv_cache_scheme": None, "sparsity_config": {}}


PUBLISHED = {  # id: (preset, quantization_config, in text_config, the format auto loads)
    "Qwen3-30B-A3B-FP8": ("qwen3-30b-a3b", {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128],
                          "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]},
                          False, "fp8 e4m3 (128x128 blocks)"),
    "Qwen3-30B-A3B-GPTQ-Int4": ("qwen3-30b-a3b", {"bits": 4, "checkpoint_format": "gptq", "desc_act": False,
                                "group_size": 128, "quant_method": "gptq", "sym": True, "true_sequential": True},
                                False, "int4 (group 128)"),
    "AWQ": ("qwen3-30b-a3b", {"bits": 4, "group_size": 128, "modules_to_not_convert": ["gate"], "quant_method": "awq",
                              "version": "gemm", "zero_point": True}, False, "int4 (group 128)"),
    "W4A16": ("qwen3-30b-a3b", _ct("pack-quantized", {"group_size": 128, "num_bits": 4, "strategy": "group",
                                                      "type": "int"}), False, "int4 (group 128)"),
    "W8A16": ("qwen3-30b-a3b", _ct("pack-quantized", {"group_size": None, "num_bits": 8, "strategy": "channel",
                                                      "type": "int"}), False, "int8"),
    "FP8-dynamic": ("glm-4.5-air", _ct("float-quantized", {"group_size": None, "num_bits": 8, "strategy": "channel",
                                                           "type": "float"}, _CT_IN_FP8), False, "int8"),
    "gpt-oss-20b": ("gpt-oss-20b", {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}, False, "mxfp4"),
    "Qwen3.5-FP8-text_config": ("qwen3.5-35b-a3b", {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": [128, 128]},
                                True, "fp8 e4m3 (128x128 blocks)"),
    # AutoFP8 / vLLM per-tensor (DeepSeek-Coder-V2-Lite-Instruct-FP8): no weight_block_size, scales
    # `weight_scale` + `input_scale`; was: planned as fp8 blocks, the load refused ("without its 'weight_scale_inv'")
    "AutoFP8-per-tensor": ("deepseek-v2-lite", {"activation_scheme": "static", "quant_method": "fp8",
                           "ignored_layers": ["lm_head", "model.layers.1.mlp.gate"]},
                           False, "fp8 e4m3 (128x128 blocks)"),
}


@pytest.mark.parametrize("case", PUBLISHED)
def test_plan_reads_published_quantization_configs(case: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """config.json shaped as the published checkpoints': the * row and the experts line name
    the format the engine loads, with its group / block, and size it as the engine does."""
    import torch

    from edgemoe.engine.budget import expert_nbytes
    from edgemoe.models.quant_load import checkpoint_scheme

    preset, qc, in_text, said = PUBLISHED[case]
    model = _published_dir(tmp_path, preset, qc, in_text)
    argv = ["plan", "--model", str(model), "--gpu-memory", "16GiB", "--bench-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    scheme = checkpoint_scheme(json.loads((model / "config.json").read_text()), model / "config.json")
    assert scheme is not None and scheme.format.label.startswith(said)
    assert f"loads the experts in {said}" in out
    _, arch, _, rows = plan_rows(build_parser().parse_args(argv))
    (auto,) = [r for r in rows if r.auto]
    assert f"\n{auto.fmt}* " in out and auto.fmt == scheme.format.name
    assert auto.expert_bytes == expert_nbytes(arch, scheme.format)
    if case == "AutoFP8-per-tensor":  # the loader reads such a linear: one scale, every block's
        q = torch.full((200, 136), 2.0).to(torch.float8_e4m3fn)
        fmt, parts = scheme.decode({"weight": q, "weight_scale": torch.tensor(0.5), "input_scale": torch.tensor(1.0)})
        assert fmt == scheme.format and torch.equal(fmt.dequantise(parts, 200, 136), torch.ones(200, 136))
