"""Kept for tests and scripts: Qwen3's tokenizer lives in `edgemoe.assets` now."""

from __future__ import annotations

from edgemoe.assets.cache import atomic_path, cache_dir, write_json
from edgemoe.assets.qwen3_tokenizer import (
    MODEL_MAX_LENGTH,
    QWEN2_PRETOKENIZE_REGEX,
    QWEN3_ADDED_TOKENS,
    QWEN3_NUM_RANKS,
    build_tokenizer_json,
    bytes_to_unicode,
    extract_merges,
    load_tiktoken_ranks,
    qwen3_tokenizer_json,
    tokenizer_config,
)

__all__ = [
    "MODEL_MAX_LENGTH", "QWEN2_PRETOKENIZE_REGEX", "QWEN3_ADDED_TOKENS", "QWEN3_NUM_RANKS", "atomic_path",
    "build_tokenizer_json", "bytes_to_unicode", "cache_dir", "extract_merges", "load_tiktoken_ranks",
    "qwen3_tokenizer_json", "tokenizer_config", "write_json",
]
