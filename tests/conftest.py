"""Shared fixtures: tiny checkpoints built once per test session."""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

# `from tolerances import ...` from any test: --import-mode=importlib does not put a
# test file's folder on sys.path.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def _share_cores_among_workers() -> None:
    """Under pytest-xdist (`make test`), each worker's torch gets its share of the cores, and
    the processes its tests start inherit it (OMP_NUM_THREADS): two workers each running torch
    on every core fight over them (the suite on 2 cores: 15:51 so, 11:18 at one thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


_share_cores_among_workers()

# NOTE: Triton picks its interpreter when a kernel is decorated, at import, and any test
# module may import a kernel module while it is collected (tests/gpu is collected before
# tests/kernels, even when deselected): so the choice is made here, before collection.
# Without CUDA, Triton kernels can only run interpreted; with CUDA, tests/gpu runs them
# compiled and the interpreter is used only when TRITON_INTERPRET=1 is asked for.
if importlib.util.find_spec("triton") is not None and not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
if os.environ.get("TRITON_INTERPRET") == "1":
    from triton_interpreter_memo import install

    install()  # device calls stop re-patching triton.language (tests/triton_interpreter_memo.py)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the heap the imports and collection made (torch, transformers, every test
    module: ~0.4 s a full collection): each engine's close collects (engine/process_memory.py),
    and ~400 closes scanning it cost the suite minutes. Nothing frozen is garbage: it is
    collected first."""
    gc.collect()
    gc.freeze()


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Freeze again after a test thawed the heap (an engine's own freeze and thaw, as on a GPU)."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow` tests are opt-in: they run only when `-m` names them (`pytest -m slow`)."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: opt in with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def make_ckpt(checkpoint_root: Path):  # noqa: ANN201
    """make_ckpt(model_type, **overrides) -> Path, memoised per argument set."""
    from edgemoe.testing import make_checkpoint

    built: dict[str, Path] = {}

    def make(model_type: str, seed: int = 0, **overrides: object) -> Path:
        key = f"{model_type}-{seed}-" + "-".join(f"{k}={v}" for k, v in sorted(overrides.items()))
        if key not in built:
            safe = key.replace("[", "").replace("]", "").replace(", ", "_").replace(" ", "")
            if len(safe) > 120:  # file names stop at 255 bytes: keep the type, hash the rest
                safe = f"{model_type}-{seed}-{hashlib.sha1(safe.encode()).hexdigest()[:16]}"
            built[key] = make_checkpoint(model_type, checkpoint_root / safe, seed=seed, **overrides)
        return built[key]

    return make


@pytest.fixture(scope="session")
def qwen3_ckpt(make_ckpt) -> Path:  # noqa: ANN001
    return make_ckpt("qwen3_moe")


@pytest.fixture(scope="session")
def c_expert_kernel() -> None:
    """Skip, saying why, where the process's CPU expert kernel is not compiled C: the device
    cache's CPU share runs only on it, and `auto` takes torch on a CPU without AVX2 (or with
    no C compiler, or `EDGEMOE_CPU_KERNEL=torch`), where hybrid falls back to offload."""
    from edgemoe.kernels.cpu_kernel import CpuExperts

    kernel = CpuExperts(threads=1)
    if not kernel.native:
        pytest.skip(f"the CPU expert kernel here is {kernel.name!r}, not compiled C: no CPU share on the device cache")
