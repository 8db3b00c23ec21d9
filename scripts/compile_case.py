"""The compile check's unit (`scripts/triton_compile_check.py`): one kernel with its
constexprs, warps, stages and pointer element types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Case:
    name: str
    kernel: Any  # a JITFunction
    consts: dict[str, Any]
    warps: int
    stages: int = 2
    ptrs: dict[str, str] = field(default_factory=dict)  # pointer element types other than the activation's
    min_arch: int = 80  # e.g. fp8 tensor cores: sm_89
    fp_fusion: bool = True  # the launch's enable_fp_fusion (a kernel's *_FP_FUSION constant where it sets one)
