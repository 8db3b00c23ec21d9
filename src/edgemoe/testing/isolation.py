"""`@isolated`: run a test in a fresh Python process.

For GPU tests that measure the process's device memory as the driver counts it: in the
shared pytest process, earlier tests' cached allocations, loaded kernels and libraries
count as this test's "CUDA context", and a cap planned on top of them is not the cap a
fresh `edgemoe serve` would get. The parent's own memory still counts on the device:
`DeviceUse` reads it before the child's context exists and leaves it out, as the
engine's plan does (engine/device_memory.py).
"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

CHILD = "EDGEMOE_ISOLATED_TEST"


class DeviceUse:
    """This process's use of CUDA device `ordinal` as the driver counts it: the device's
    use now less its use before this process's context (create this before that context
    exists: in a fresh process, before any CUDA work); the whole device's use when the
    driver can't say (engine/device_memory.py)."""

    def __init__(self, ordinal: int = 0) -> None:
        from edgemoe.engine.device_memory import baseline

        self.ordinal = ordinal
        self.before = baseline(ordinal)

    def now(self) -> int:
        import torch

        ours = self.before.ours() if self.before else None
        if ours is not None:
            return ours
        free, total = torch.cuda.mem_get_info(self.ordinal)
        return total - free

    def peak_until_finished(self, engine: Any, request_id: str) -> int:
        """Step `engine` until `request_id` finishes; the highest use read between steps."""
        peak, done = 0, False
        while not done:
            for out in engine.step():
                done |= out.request_id == request_id and out.finished
            peak = max(peak, self.now())
        return peak


def isolated(test: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(CHILD) == "1":
            return test(*args, **kwargs)
        _release_cached_device_memory()
        node = f"{inspect.getsourcefile(test)}::{test.__name__}"
        cmd = [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider",
               "-o", "addopts=--import-mode=importlib"]
        r = subprocess.run(cmd, env={**os.environ, CHILD: "1"}, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{node} in a fresh process:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
        return None

    return run


def _release_cached_device_memory() -> None:
    """The parent's cached blocks back to the driver, so the child has the device's room."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
