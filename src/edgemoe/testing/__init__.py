"""Test material that exists offline: tiny seeded checkpoints, Qwen3's tokenizer, a chat template.

The production parts (tokenizer, template, checkpoint factory, demo model) live in
`edgemoe.assets`; this package re-exports them for tests and scripts and adds the
test-only scripted engine (`agent_backend`). Production code never imports it.

NOTE: ``make_checkpoint`` and ``demo_model_path`` are resolved lazily so that importing
this package never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemoe.assets.chat_template import QWEN3_CHAT_TEMPLATE
from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json

if TYPE_CHECKING:
    from edgemoe.assets.checkpoint import make_checkpoint
    from edgemoe.assets.demo import demo_model_path

__all__ = ["QWEN3_CHAT_TEMPLATE", "demo_model_path", "make_checkpoint", "qwen3_tokenizer_json"]


def __getattr__(name: str) -> Any:
    if name == "make_checkpoint":
        from edgemoe.assets.checkpoint import make_checkpoint

        return make_checkpoint
    if name == "demo_model_path":
        from edgemoe.assets.demo import demo_model_path

        return demo_model_path
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
