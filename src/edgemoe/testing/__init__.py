"""Test material that exists offline: tiny seeded checkpoints, Qwen3's tokenizer, a chat template.

NOTE: ``make_checkpoint`` and ``demo_model_path`` are resolved lazily so that the
server process (which never imports torch) can use the tokenizer and the template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemoe.testing.chat_template import QWEN3_CHAT_TEMPLATE
from edgemoe.testing.tokenizer_factory import qwen3_tokenizer_json

if TYPE_CHECKING:
    from edgemoe.testing.checkpoint import make_checkpoint
    from edgemoe.testing.demo import demo_model_path

__all__ = ["QWEN3_CHAT_TEMPLATE", "demo_model_path", "make_checkpoint", "qwen3_tokenizer_json"]


def __getattr__(name: str) -> Any:
    if name == "make_checkpoint":
        from edgemoe.testing.checkpoint import make_checkpoint

        return make_checkpoint
    if name == "demo_model_path":
        from edgemoe.testing.demo import demo_model_path

        return demo_model_path
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
