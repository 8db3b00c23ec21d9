"""Session fixtures for edgemoe.testing: each tiny checkpoint is built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgemoe.testing import make_checkpoint

MODEL_TYPES = ("qwen3_moe", "olmoe", "mixtral")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One default (bf16) checkpoint per supported model type."""
    root = tmp_path_factory.mktemp("ckpt")
    return {mt: make_checkpoint(mt, root / mt, seed=0) for mt in MODEL_TYPES}


@pytest.fixture(scope="session")
def qwen3_fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A qwen3_moe checkpoint stored in fp32, with one dense MLP layer in the middle."""
    return make_checkpoint("qwen3_moe", tmp_path_factory.mktemp("fp32"), seed=0, torch_dtype="float32", mlp_only_layers=[1])
