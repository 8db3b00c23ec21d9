"""`edgemoe bench bw` runs end to end on a small expert shape and writes its results."""

from __future__ import annotations

import json

from edgemoe.bench.host_counters import disturbance
from edgemoe.cli import main
from edgemoe.kernels import cpu_isa


def test_bench_bw_writes_json_and_png(tmp_path, capsys) -> None:  # noqa: ANN001
    kernels = ["avx2", "torch"] if cpu_isa.supported("avx2") else ["torch"]
    argv = ["bench", "bw", "--hidden", "64", "--intermediate", "32", "--pool-mib", "1", "--read-gib", "0.01",
            "--seconds", "0", "--threads", "2", "--out", str(tmp_path), "--kernels", *kernels]
    assert main(argv) == 0
    (result,) = tmp_path.glob("bw-*.json")
    data = json.loads(result.read_text())
    assert result.with_suffix(".png").exists()
    assert data["expert_bytes"] == 3 * 64 * 32 * 2 and data["host"]["kernel_read_gb_s"] > 0
    measured = {(r["kernel"], r["tokens"], r["experts_per_call"]) for r in data["experts"]}
    torch_int8 = {(k, 1, e) for k in ("torch-int8pack", "torch-int8pack hot") for e in (1, 8)}  # the int8 yardstick
    assert measured == {(k, n, e) for k in kernels for n, e in ((1, 1), (8, 1), (32, 1), (1, 8))} | torch_int8
    assert all(r["gb_s"] > 0 and r["best_gb_s"] >= r["gb_s"] for r in data["experts"])
    # The C kernel's rows also time its calls alone, from job tables built beforehand.
    native = [r for r in data["experts"] if r["kernel"] == "avx2"]
    assert all(r["kernel_gb_s"] > 0 and r["kernel_best_gb_s"] >= r["kernel_gb_s"] for r in native)
    assert not any("kernel_gb_s" in r for r in data["experts"] if r["kernel"].startswith("torch"))
    assert "CPU experts" in capsys.readouterr().out
    # The host's counters over the run (Linux; {} elsewhere), with disturbance()'s note when
    # the hypervisor took CPU time (tests/bench/test_host_counters.py: its thresholds).
    assert all(v >= 0 for k, v in data["host_counters"].items() if k.endswith("_ticks"))
    assert data.get("host_note") == disturbance(data["host_counters"])


def test_prompt_shapes_time_many_tokens_of_many_experts_on_a_blocked_kernel(tmp_path) -> None:  # noqa: ANN001
    import pytest

    if not cpu_isa.supported("avx512"):
        pytest.skip("the blocked (many-token) path needs AVX-512 BF16 or AMX")
    argv = ["bench", "bw", "--hidden", "64", "--intermediate", "32", "--pool-mib", "1", "--read-gib", "0.01",
            "--seconds", "0", "--threads", "2", "--out", str(tmp_path), "--kernels", "avx512", "--weights", "bf16",
            "fp8", "--prompt-shapes", "4x3", "16x2"]
    assert main(argv) == 0
    data = json.loads(next(tmp_path.glob("bw-*.json")).read_text())
    prompt = [r for r in data["experts"] if r["tokens"] > 1 and r["experts_per_call"] > 1]
    assert {(r.get("weights", "bf16"), r["tokens"], r["experts_per_call"]) for r in prompt} == {
        (w, t, e) for w in ("bf16", "fp8") for t, e in ((4, 3), (16, 2))}
    for r in prompt:  # 6·H·I flops a token an expert, over the call's time
        want = 6 * 64 * 32 * r["tokens"] * r["experts_per_call"] / (r["kernel_us_per_call"] * 1e-6) / 1e12
        assert r["kernel_tflops"] == want > 0


def test_a_bad_prompt_shape_names_the_flag(capsys) -> None:  # noqa: ANN001
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["bench", "bw", "--prompt-shapes", "32by16"])
    assert e.value.code == 2 and "--prompt-shapes" in capsys.readouterr().err
