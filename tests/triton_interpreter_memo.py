"""Triton's interpreter, made to stop re-patching `triton.language` at every device call.

Triton 3.6's interpreter patches the language module (`_patch_lang`: `inspect.getmembers`
over `tl`, `tl.tensor`, `tl.math`, ... — ~0.2 ms) once per kernel launch, and again at
*every* call of a `@triton.jit` helper from inside the kernel, for every program of the
grid. The launch's patch already covers the helper when both see the same language
modules, so the repeat is pure overhead: ~40% of an interpreted test's time in our
quantised-MoE kernels, whose helpers run in every loop iteration.

`install()` wraps `_patch_lang` to skip a call whose language modules the current launch
has already patched, and the launch to forget them when it ends (its patch is undone
then). A helper that sees a language module the launch did not patch is patched as
before. A Triton without `_patch_lang` and `GridExecutor` gets no wrapper; another
version that kept the names but changed what they do would need this file read again
(written against Triton 3.6.0, the CPU test venv's).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


class _Nothing:
    """The scope of a skipped patch: nothing to undo."""

    def restore(self) -> None:
        pass


def _language_modules(fn: Callable, tl: Any) -> frozenset[int]:
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def install() -> bool:
    """Wraps the interpreter's patching; True when installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if original is None or executor is None or getattr(original, "memoised", False):
        return False
    patched: set[int] = set()  # language modules the launch in progress has patched
    launch = executor.__call__

    langs_of: dict[Callable, frozenset[int]] = {}  # a function's globals name the same modules every call

    @functools.wraps(original)
    def patch_lang(fn: Callable) -> Any:
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = _language_modules(fn, tl)
        if langs and langs <= patched:
            return _Nothing()
        scope = original(fn)
        patched.update(langs)
        return scope

    @functools.wraps(launch)
    def launch_once_patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()  # the launch's own patch is undone as it returns

    patch_lang.memoised = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch_once_patched
    return True
