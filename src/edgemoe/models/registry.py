"""Model registry keyed by Hugging Face `model_type`; model modules import lazily."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from edgemoe.models.arch import ConfigError, ModelArch

MODEL_MODULES: dict[str, str] = {
    "qwen3_moe": "edgemoe.models.qwen3_moe",
    "olmoe": "edgemoe.models.olmoe",
    "mixtral": "edgemoe.models.mixtral",
    "qwen3_next": "edgemoe.models.qwen3_next",
    "qwen3_5_moe": "edgemoe.models.qwen3_5_moe",
    "qwen3_5_moe_text": "edgemoe.models.qwen3_5_moe",
    "qwen4_exp": "edgemoe.models.qwen4_exp",
    "qwen4_exp_text": "edgemoe.models.qwen4_exp",
    "glm4_moe": "edgemoe.models.glm4_moe",
    "gpt_oss": "edgemoe.models.gpt_oss",
    "deepseek_v2": "edgemoe.models.deepseek_v2",
    "deepseek_v3": "edgemoe.models.mla",
    "glm4_moe_lite": "edgemoe.models.mla",
    "minimax_m2": "edgemoe.models.minimax_m2",
    "ernie4_5_moe": "edgemoe.models.ernie4_5_moe",
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


def skipped_prefixes(module: ModuleType, arch: object) -> tuple[str, ...]:
    """Checkpoint tensor-name prefixes a model file does not read (a vision tower, an MTP
    head): its fixed `IGNORED_PREFIXES` and, where they depend on the arch (GLM's MTP layers
    after the last one), its `ignored_prefixes(arch)`. The loader skips them; `convert`
    copies them as stored."""
    by_arch = getattr(module, "ignored_prefixes", None)
    return tuple(getattr(module, "IGNORED_PREFIXES", ())) + (tuple(by_arch(arch)) if by_arch else ())


def model_arch(config: Mapping[str, Any], where: Path | str = "config.json") -> ModelArch:
    """The arch `config` (read from `where`) describes; every refusal is a ConfigError naming
    `where` and the field. NOTE: a config.json is data from whoever published it: a value
    of a type the model file did not expect (a string for a count, an object for a list)
    must give a clean error, not a traceback, so those are caught here too."""
    try:
        if not isinstance(config, Mapping):
            raise ConfigError(f"expected a JSON object, got {type(config).__name__}")
        return model_module(config.get("model_type")).arch(dict(config))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"{where}: a setting has a value of the wrong type or range ({type(e).__name__}: {e})") from None
