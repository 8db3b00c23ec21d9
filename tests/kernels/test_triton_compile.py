"""The compiled path (not the interpreter's): every Triton kernel compiles for sm_86
(Ampere ISA, ~99 KiB of shared memory per block: the tightest consumer target) without
a GPU, through scripts/triton_compile_check.py in a fresh process (no interpreter); the
decode step's kernels with USE_PDL compile for sm_90 with `griddepcontrol.wait` ahead of
every global memory access in their PTX (and none of it with the switch off, on sm_86)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compile_jobs() -> int:
    """The script's processes: every CPU, and at least 4. It deals the kernels out in turn
    (every N-th to one process) and their compile times differ tenfold: on CI's 2 cores, 2
    processes split sm_86's work about 2:1, while 4 (2 a core) even it out (~15% sooner)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(4, cpus)


def compile_check(tmp_path: Path, *args: str) -> str:
    """The script's output; it must pass."""
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": path}  # a fresh cache: really compile
    env.pop("TRITON_INTERPRET", None)
    script = [sys.executable, str(ROOT / "scripts" / "triton_compile_check.py"), "--jobs", str(compile_jobs())]
    run = subprocess.run([*script, *args],
                         check=False, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failure(s)" in run.stdout
    return run.stdout


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_kernels_compile_for_sm86(tmp_path: Path) -> None:
    out = compile_check(tmp_path, "--arch", "86")
    assert "USE_PDL=False: ok" in out  # the switch's kernels hold no griddepcontrol when off


# The decode step's kernels (docs/kernels.md), each named by at least one compile-check case.
PDL_CASES = ("moe gate_up gemv S=1", "moe down gemv S=1", "moe gate_up gemv int8", "moe down gemv int8",
             "moe combine", "moe combine + rms norm", "decode split D=128", "decode merge", "add rms norm",
             "add rms norm + router gemv + top-k",
             "q/k head norms + rope + kv write",
             "route top-k", "router gemv + top-k", "slot plan E=128 S=64", "slot plan E=128 S=64 in registers", "row gather", "row gather into, 1 part(s)",
             "row gather into, 6 part(s)",
             "dense gemv 1 token(s) a block", "dense gemv 8 token(s) a block",
             "hc norm + inject", "hc gates", "hc mix", "gdn gates", "conv update dilation 1", "gated norm",
             "qsa block scores", "shared gate", "router gemv + top-10 E=512")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_pdl_kernels_wait_first_on_sm90(tmp_path: Path) -> None:
    lines = compile_check(tmp_path, "--arch", "90", "--pdl").splitlines()
    for name in PDL_CASES:
        line = next((x for x in lines if f" sm_90 bf16 {name}: " in x), "")
        assert line.startswith("ok") and line.endswith("USE_PDL=True: ok"), name


CHECKER = """
import sys
sys.path.insert(0, sys.argv[1])
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_compile_check import pdl_ptx_ok

@triton.jit
def early(x_ptr, y_ptr):
    v = tl.load(x_ptr)
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    tl.store(y_ptr, v)

@triton.jit
def waits(x_ptr, y_ptr):
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    tl.store(y_ptr, tl.load(x_ptr))

def ptx(fn):
    src = ASTSource(fn, {"x_ptr": "*fp32", "y_ptr": "*fp32"}, {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": True}).asm["ptx"]

print(pdl_ptx_ok(ptx(early), True), pdl_ptx_ok(ptx(waits), True), pdl_ptx_ok(ptx(waits), False))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_the_ptx_check_sees_a_load_before_the_wait(tmp_path: Path) -> None:
    # The check itself: a load ahead of griddepcontrol.wait fails it, the wait first passes.
    (tmp_path / "check.py").write_text(CHECKER)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(ROOT / "scripts")],
                         check=False, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True", "False"]
