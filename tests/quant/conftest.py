"""Quantisation tests. `quant_ckpt_support` is made importable here, since
`--import-mode=importlib` keeps a test's folder off `sys.path`."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
