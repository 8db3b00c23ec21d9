"""Kept for tests: the chat template lives in `edgemoe.assets.chat_template` now."""

from __future__ import annotations

from edgemoe.assets.chat_template import QWEN3_CHAT_TEMPLATE

__all__ = ["QWEN3_CHAT_TEMPLATE"]
