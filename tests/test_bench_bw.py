"""`edgemoe bench bw` runs end to end on a small expert shape and writes its results."""

from __future__ import annotations

import json

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
