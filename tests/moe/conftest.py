"""`cpu_expert_support` (the CPU expert kernel's error bounds, tests/kernels) is made
importable here too: the executor tests bound the kernel's bf16 results with it."""

from __future__ import annotations

import sys
from pathlib import Path

_KERNELS = str(Path(__file__).resolve().parents[1] / "kernels")
if _KERNELS not in sys.path:
    sys.path.append(_KERNELS)
