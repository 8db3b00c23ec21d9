"""Kernel tests. `gdn_support` and `cpu_expert_support` are made importable here, since
`--import-mode=importlib` keeps a test's folder off `sys.path`.

Triton kernel tests run under Triton's interpreter on CPU tensors (small shapes).

NOTE: TRITON_INTERPRET must be set before any kernel module is imported (`triton.jit`
picks the interpreter at decoration time), so it is set here, at collection. On a
machine with CUDA the interpreter tests are skipped unless TRITON_INTERPRET=1 is set
(tests/gpu covers the compiled kernels, and the interpreter must not capture them).
Test modules read the decision back from the environment.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

HAVE_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = HAVE_TRITON and (os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available())


def _patch_scalar_index() -> None:
    """Triton 3.6's interpreter converts loop bounds with int() on 1-element arrays,
    which numpy >= 2.4 refuses; later Triton squeezes first. Same fix, test-only."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # another Triton: nothing to patch
        return

    def patched(tensor, scope):  # noqa: ANN001, ANN202
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
    _patch_scalar_index()
