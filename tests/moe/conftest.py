"""`cpu_expert_support` (the CPU expert kernel's error bounds, tests/kernels) is made
importable here too: the executor tests bound the kernel's bf16 results with it; so is
this folder's own `cpu_share_support` (the CPU share's test material). `kernel`: the
compiled CPU expert kernel on 2 threads, once a module (a test module may define its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgemoe.kernels.cpu_kernel import CpuExperts

_KERNELS = str(Path(__file__).resolve().parents[1] / "kernels")
if _KERNELS not in sys.path:
    sys.path.append(_KERNELS)
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)


@pytest.fixture(scope="module")
def kernel() -> CpuExperts:
    k = CpuExperts(threads=2)
    if not k.native:
        pytest.skip("no compiled CPU expert kernel (no C compiler)")
    return k
