"""Which implementation a kernel dispatcher runs: Triton on CUDA tensors when Triton is
importable, the torch reference otherwise.

NOTE: nothing here imports Triton at module load; a CPU-only install without Triton
imports every `edgemoe.kernels.*` module.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    """True when the fast path should run on `t`'s device.

    `EDGEMOE_TRITON=0` forces the torch references (A/B runs, bisecting a numeric issue).
    """
    if os.environ.get("EDGEMOE_TRITON", "1") == "0":
        return False
    return t.is_cuda and triton_importable()
