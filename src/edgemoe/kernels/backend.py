"""Which implementation a kernel dispatcher runs: Triton on CUDA tensors when Triton is
importable, the torch reference otherwise; and whether the Triton kernels launch with
programmatic dependent launch (`pdl_enabled`, docs/kernels.md).

NOTE: nothing here imports Triton at module load; a CPU-only install without Triton
imports every `edgemoe.kernels.*` module.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from edgemoe.env_switch import env_switch


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
    if not env_switch("EDGEMOE_TRITON", True):
        return False
    return t.is_cuda and (dtype or t.dtype) in FAST_DTYPES and triton_importable()


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (any TRITON_INTERPRET but an explicit
    off: when unsure, PDL stays off)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no")


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with programmatic dependent launch (`USE_PDL` and
    `launch_pdl` of the decode step's Triton kernels): a CUDA device of compute capability 9
    or above (Hopper's `griddepcontrol`), Triton not interpreting, and not turned off with
    `EDGEMOE_PDL=0`. On by default since measured on an H200 (2026-12-01, resident
    random:qwen3-30b-a3b at 1K: 301.1 vs 277.6 tok/s at batch 1, 917.3 vs 887.8 at batch 8).

    NOTE: the one place the switch is read. It is read at every launch, so a CUDA graph
    records what was set when it was captured.
    """
    if not env_switch("EDGEMOE_PDL", True) or device.type != "cuda" or _interpreting():
        return False
    return _capability(torch.cuda.current_device() if device.index is None else device.index) >= (9, 0)
