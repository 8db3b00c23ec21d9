"""The demo model that ``make serve`` answers with when no model is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgemoe.assets.cache import atomic_dir, cache_dir

DEMO_NAME = "demo-qwen3-moe-v2"  # bump the suffix when DEMO_CONFIG or the weight init changes
DEMO_SEED = 0
DEMO_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 128,
    "intermediate_size": 512,
    "max_window_layers": 4,
    # Qwen3's real context length, so agent sessions can grow past 32K tokens.
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}


def demo_model_path() -> Path:
    """Path of the demo qwen3_moe checkpoint, built under the cache dir on first use.

    NOTE: built in a temp dir and renamed into place, so a reader never sees a partial
    checkpoint; if another process renamed first, its (identical) copy is used.
    """
    dest = cache_dir() / DEMO_NAME
    if (dest / "config.json").exists():
        return dest
    # Imported here: resolving an existing demo must not pull in torch (the server has none).
    from edgemoe.assets.checkpoint import make_checkpoint

    with atomic_dir(dest) as tmp:
        make_checkpoint("qwen3_moe", tmp, seed=DEMO_SEED, **DEMO_CONFIG)
    return dest
