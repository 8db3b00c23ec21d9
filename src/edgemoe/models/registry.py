"""Model registry keyed by Hugging Face `model_type`; model modules import lazily."""

from __future__ import annotations

import importlib
from types import ModuleType

from edgemoe.models.arch import ConfigError

MODEL_MODULES: dict[str, str] = {
    "qwen3_moe": "edgemoe.models.qwen3_moe",
    "olmoe": "edgemoe.models.olmoe",
    "mixtral": "edgemoe.models.mixtral",
    "qwen3_next": "edgemoe.models.qwen3_next",
    "qwen3_5_moe": "edgemoe.models.qwen3_5_moe",
    "qwen3_5_moe_text": "edgemoe.models.qwen3_5_moe",
    "qwen4_exp": "edgemoe.models.qwen4_exp",
    "qwen4_exp_text": "edgemoe.models.qwen4_exp",
}


def supported_model_types() -> list[str]:
    return sorted(MODEL_MODULES)


def model_module(model_type: str | None) -> ModuleType:
    """The module with `arch(config)` and `checkpoint_map(arch)` for this model_type."""
    if model_type not in MODEL_MODULES:
        raise ConfigError(
            f"unknown model_type {model_type!r}; supported: {', '.join(supported_model_types())}"
        )
    return importlib.import_module(MODEL_MODULES[model_type])
