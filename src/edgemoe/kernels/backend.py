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


FAST_DTYPES = (torch.bfloat16, torch.float16)


def use_triton(t: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """True when the fast path should run on `t`'s device for activations of `dtype`
    (default: t's own dtype; `moe_combine` passes its output dtype, its cells are fp32).

    bf16/fp16 on CUDA only: fp32 on a GPU is a reference run, so it takes the exact
    eager references (the Triton kernels accept fp32, but their tiles are sized for
    2-byte elements: fp32 extend tiles at head dim 256 overflow sm_86's shared memory).
    `EDGEMOE_TRITON=0` forces the torch references (A/B runs, bisecting a numeric issue).
    """
    if os.environ.get("EDGEMOE_TRITON", "1") == "0":
        return False
    return t.is_cuda and (dtype or t.dtype) in FAST_DTYPES and triton_importable()
