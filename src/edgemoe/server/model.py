"""What the server knows about the loaded model: name, tokenizer, template, parser, defaults.

Built once from the engine's `EngineReady` (which names the resolved checkpoint
directory), by reading the checkpoint's tokenizer and config files: no torch.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemoe.messages import EngineReady
from edgemoe.server.config import ServerConfig
from edgemoe.server.logprobs import TokenTexts
from edgemoe.server.parsers import parser_for_chat_template, pick_tool_format
from edgemoe.server.prompt_tokens import PromptTokenizer
from edgemoe.server.template_sandbox import RenderLimits
from edgemoe.server.templates import ChatTemplate
from edgemoe.structured.call_tokens import tag_texts
from edgemoe.tokenizer import TokenizerBundle

log = logging.getLogger(__name__)

# generation_config.json keys that become request defaults (a request's own value wins).
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class ServedModel:
    name: str
    info: EngineReady
    tokenizer: TokenizerBundle
    template: ChatTemplate | None
    template_error: str | None  # why there is no template (None: it loaded, or none shipped)
    tool_parser: str | None
    reasoning: bool  # the template knows `<think>` blocks
    teaches_calls: bool  # the template shows the model a tool-call format we parse (forced_call)
    sampling_defaults: dict[str, float | int]
    created: int
    tokens: TokenTexts
    prompt_tokens: PromptTokenizer  # bounded prompt tokenisation (pieces, stops at a limit)

    @classmethod
    def load(cls, info: EngineReady, config: ServerConfig) -> ServedModel:
        model_dir = Path(info.model_dir)
        tokenizer = TokenizerBundle.load(model_dir)
        limits = RenderLimits(timeout_s=config.template_timeout, max_output_chars=config.template_output_limit)
        template, error = _load_template(tokenizer, limits)
        source = template.source if template is not None else ""
        return cls(
            name=config.served_model_name or info.model_name or model_dir.name,
            info=info,
            tokenizer=tokenizer,
            template=template,
            template_error=error,
            tool_parser=pick_tool_format(config.tool_call_parser, source, info.model_type),
            reasoning="</think>" in source,
            teaches_calls=bool(source) and parser_for_chat_template(source) is not None,
            sampling_defaults=_sampling_defaults(model_dir / "generation_config.json"),
            created=int(time.time()),
            tokens=TokenTexts(tokenizer.tokenizer),
            prompt_tokens=PromptTokenizer(tokenizer),
        )

    @property
    def writes_call_tags(self) -> bool:
        """Whether its format's call tags are single tokens (strict calls need them):
        `<tool_call>` and `</tool_call>`, or MiniMax-M2's `<minimax:tool_call>` block tags."""
        t = self.tokenizer.tokenizer
        return all(t.token_to_id(tag.decode()) is not None for tag in tag_texts(self.tool_parser or ""))

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def serves(self, name: str | None, strict: bool) -> bool:
        """Whether a request naming `name` is ours (any name is, unless strict)."""
        return not strict or name is None or name == self.name


def _load_template(tokenizer: TokenizerBundle, limits: RenderLimits) -> tuple[ChatTemplate | None, str | None]:
    try:
        return ChatTemplate.from_tokenizer(tokenizer, limits), None
    except ValueError as exc:
        # Serve anyway: /v1/completions and tokenize still work; chat answers 400 with this.
        log.warning("chat template unusable: %s", exc)
        return None, str(exc)


def _sampling_defaults(path: Path) -> dict[str, float | int]:
    try:
        config: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {
        k: config[k]
        for k in SAMPLING_DEFAULT_KEYS
        if isinstance(config.get(k), (int, float)) and not isinstance(config.get(k), bool)
    }
