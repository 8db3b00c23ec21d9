"""The compiled path (not the interpreter's): every Triton kernel compiles for sm_86
(Ampere ISA, ~99 KiB of shared memory per block: the tightest consumer target) without
a GPU, through scripts/triton_compile_check.py in a fresh process (no interpreter)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_kernels_compile_for_sm86(tmp_path: Path) -> None:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": path}  # a fresh cache: really compile
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "triton_compile_check.py"), "--arch", "86"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failure(s)" in run.stdout
