"""Quantised weights: expert formats (how an expert is stored, its fp32 reference), the
published checkpoint layouts they load from, and the KV cache's fp8 form.

Leaf package: imports torch only, so kernels, the loader and the executors can all use it.
"""

from __future__ import annotations

import torch

from edgemoe.quant.formats import (
    Dense,
    ExpertFormat,
    Parts,
    dequantise_expert,
    expert_nbytes,
    expert_specs,
    matrix_parts,
    quantise_expert,
)
from edgemoe.quant.fp8 import Fp8Block
from edgemoe.quant.int4 import Int4Group
from edgemoe.quant.int8 import Int8Channel
from edgemoe.quant.mxfp4 import Mxfp4

EXPERT_DTYPES = ("auto", "bf16", "fp8", "int8", "int4", "mxfp4")


def expert_format(name: str, dtype: torch.dtype = torch.bfloat16) -> ExpertFormat:
    """The format `--expert-dtype` names with its default group/block size; `bf16` keeps
    the experts unquantised in the model's `dtype`."""
    formats: dict[str, ExpertFormat] = {
        "bf16": Dense(dtype), "fp8": Fp8Block(), "int8": Int8Channel(), "int4": Int4Group(), "mxfp4": Mxfp4(),
    }
    if name not in formats:
        raise ValueError(f"expert_dtype (--expert-dtype) {name!r}: choose one of {', '.join(EXPERT_DTYPES[1:])}")
    return formats[name]


def resolve_expert_format(setting: str, checkpoint: ExpertFormat | None, dtype: torch.dtype) -> ExpertFormat:
    """The experts' format for `--expert-dtype` on a checkpoint whose experts are stored in
    `checkpoint` (None: unquantised). auto keeps the checkpoint's; naming the checkpoint's
    own kind keeps its group/block size (no re-quantisation)."""
    if setting == "auto":
        return checkpoint or Dense(dtype)
    if checkpoint is not None and checkpoint.name == setting:
        return checkpoint
    return expert_format(setting, dtype)


__all__ = [
    "EXPERT_DTYPES",
    "Dense",
    "ExpertFormat",
    "Fp8Block",
    "Int4Group",
    "Int8Channel",
    "Mxfp4",
    "Parts",
    "dequantise_expert",
    "expert_format",
    "expert_nbytes",
    "expert_specs",
    "matrix_parts",
    "quantise_expert",
    "resolve_expert_format",
]
