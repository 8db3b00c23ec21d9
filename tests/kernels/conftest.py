"""Kernel test fixtures. ``cpu_expert_support`` is made importable here: the suite runs
with ``--import-mode=importlib``, which does not put a test file's folder on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
