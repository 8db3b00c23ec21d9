"""Test material that exists offline: tiny seeded checkpoints, Qwen3's tokenizer, a chat template."""

from __future__ import annotations

from edgemoe.testing.chat_template import QWEN3_CHAT_TEMPLATE
from edgemoe.testing.checkpoint import make_checkpoint
from edgemoe.testing.demo import demo_model_path
from edgemoe.testing.tokenizer_factory import qwen3_tokenizer_json

__all__ = ["QWEN3_CHAT_TEMPLATE", "demo_model_path", "make_checkpoint", "qwen3_tokenizer_json"]
