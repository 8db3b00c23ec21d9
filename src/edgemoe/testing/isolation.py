"""`@isolated`: run a test in a fresh Python process.

For GPU tests that measure the process's device memory as the driver counts it: in the
shared pytest process, earlier tests' cached allocations, loaded kernels and libraries
count as this test's "CUDA context", and a cap planned on top of them is not the cap a
fresh `edgemoe serve` would get.
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


def isolated(test: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(CHILD) == "1":
            return test(*args, **kwargs)
        node = f"{inspect.getsourcefile(test)}::{test.__name__}"
        cmd = [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider",
               "-o", "addopts=--import-mode=importlib"]
        r = subprocess.run(cmd, env={**os.environ, CHILD: "1"}, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{node} in a fresh process:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
        return None

    return run
