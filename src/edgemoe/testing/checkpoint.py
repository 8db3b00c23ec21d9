"""Kept for tests and scripts: the tiny checkpoint factory lives in `edgemoe.assets` now
(the demo model is built with it)."""

from __future__ import annotations

from edgemoe.assets.checkpoint import (
    FAMILIES,
    init_tensor,
    make_checkpoint,
    model_config,
    tensor_specs,
)
from edgemoe.assets.model_files import ENDOFTEXT_ID, write_tokenizer_files

__all__ = [
    "ENDOFTEXT_ID", "FAMILIES", "init_tensor", "make_checkpoint", "model_config", "tensor_specs",
    "write_tokenizer_files",
]
