"""Structured-output tests: `from grammar_support import …` needs this folder on sys.path
(`--import-mode=importlib` keeps a test's folder off it)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
