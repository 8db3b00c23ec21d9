"""Server test fixtures: in-process servers over a scripted engine (and the real one).

``server_harness`` and ``server_scripts`` are made importable here: the suite runs with
``--import-mode=importlib``, which does not put a test file's folder on ``sys.path``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from server_harness import MakeServer, ScriptedEngine, ServerHarness  # noqa: E402
from server_scripts import SCRIPTS  # noqa: E402

from edgemoe.server.config import ServerConfig  # noqa: E402
from edgemoe.tokenizer import TokenizerBundle  # noqa: E402


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    from edgemoe.testing import demo_model_path

    return demo_model_path()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_dir: Path) -> TokenizerBundle:
    return TokenizerBundle.load(demo_dir)


@pytest.fixture(scope="session")
def make_scripted(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[MakeServer]:
    """make_scripted(**ServerConfig fields) -> a started server over a ScriptedEngine."""
    started: list[ServerHarness] = []

    def make(**config: Any) -> ServerHarness:
        engine = ScriptedEngine(demo_tokenizer, SCRIPTS)
        harness = ServerHarness(engine, engine.ready(demo_dir), ServerConfig(**config)).start()
        started.append(harness)
        return harness

    yield make
    for harness in started:
        harness.stop()


@pytest.fixture(scope="session")
def scripted(make_scripted: MakeServer) -> ServerHarness:
    """The default server (no key, lenient names, thinking on) over the scripted engine."""
    return make_scripted()


@pytest.fixture(scope="module")
def real_fp32(demo_dir: Path) -> Iterator[ServerHarness]:
    """A server over the real engine (demo model, CPU) in float32: batch neighbours must
    not move a greedy choice through rounding alone."""
    from edgemoe.engine.service import build_engine

    engine, ready = build_engine({"model": str(demo_dir), "max_model_len": 1024, "dtype": "float32"})
    harness = ServerHarness(engine, ready, ServerConfig()).start(timeout=120)
    yield harness
    harness.stop()

