"""The demo checkpoint: built once under the cache dir, safely under concurrency."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgemoe.testing import demo_model_path, qwen3_tokenizer_json
from edgemoe.testing.demo import DEMO_NAME


def test_concurrent_first_use_builds_one_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = qwen3_tokenizer_json()  # from the real cache: this test is about the demo race
    monkeypatch.setenv("EDGEMOE_CACHE_DIR", str(tmp_path))
    shutil.copyfile(tokenizer, tmp_path / tokenizer.name)
    # Two racing builders must agree on one finished directory.
    with ThreadPoolExecutor(max_workers=2) as pool:
        paths = list(pool.map(lambda _: demo_model_path(), range(2)))
    assert paths[0] == paths[1] == tmp_path / DEMO_NAME
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.startswith(".")] == []  # temp files and dirs cleaned up
    config = json.loads((paths[0] / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_experts"], config["num_experts_per_tok"]) == (
        "qwen3_moe", 256, 16, 4)
    assert config["torch_dtype"] == "bfloat16"
    assert (paths[0] / "model.safetensors.index.json").exists() and (paths[0] / "tokenizer.json").exists()
    stamp = (paths[0] / "config.json").stat().st_mtime_ns
    assert demo_model_path() == paths[0] and (paths[0] / "config.json").stat().st_mtime_ns == stamp
