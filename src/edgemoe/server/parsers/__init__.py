"""Reasoning and tool-call parsers: model text → content, reasoning, tool calls.

Tool parsers are chosen by name (``--tool-call-parser``) and imported only when chosen.
``parser_for_model_type`` gives a family's default format. ``strips_answer_tags`` says
whether a model's content is unwrapped from ERNIE's ``<response>`` tags (ernie45.py).
"""

from __future__ import annotations

import importlib

from edgemoe.server.parsers.base import (
    ParsedDelta,
    ParsedMessage,
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    accumulate,
)
from edgemoe.server.parsers.ernie45 import AnswerTagResponseParser, strips_answer_tags
from edgemoe.server.parsers.reasoning import (
    ThinkReasoningParser,
    close_open_reasoning,
    prompt_opens_reasoning,
)
from edgemoe.server.parsers.response import ResponseParser

# name → "module:Class", imported on first use.
TOOL_PARSERS: dict[str, str] = {
    "hermes": "edgemoe.server.parsers.hermes:HermesToolParser",
    "qwen3_coder": "edgemoe.server.parsers.qwen3_coder:Qwen3CoderToolParser",
    "glm45": "edgemoe.server.parsers.glm45:Glm45ToolParser",
    "harmony": "edgemoe.server.parsers.harmony:HarmonyToolParser",
    "deepseek_v3": "edgemoe.server.parsers.deepseek_v3:DeepSeekV3ToolParser",
    "minimax_m2": "edgemoe.server.parsers.minimax_m2:MiniMaxM2ToolParser",
}

# Formats whose special tokens frame every message, reasoning included: their tool parser
# reads the whole output, tools or not, with those tokens kept in the text (generation.py).
WHOLE_OUTPUT_FORMATS = frozenset({"harmony"})

# Formats whose markers a tokenizer flags (or may flag) special: the detokenizer keeps special
# tokens in the text these parsers read (generation.py). Harmony's channel markers are
# special; MiniMax-M2's `<minimax:tool_call>` / `<think>` are added tokens of its own
# tokenizer, which the parser must see whatever their flag.
KEEPS_SPECIAL_TOKENS = frozenset({"harmony", "minimax_m2"})

# HF model_type → its family's default tool-call format.
_MODEL_TYPE_PARSER: dict[str, str] = {
    "qwen2": "hermes",
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "olmoe": "hermes",
    "mixtral": "hermes",
    "qwen3_5_moe": "qwen3_coder",
    "qwen3_5_moe_text": "qwen3_coder",
    "qwen3_next": "qwen3_coder",
    "qwen4_exp": "qwen3_coder",
    "glm4_moe": "glm45",
    "glm4_moe_lite": "glm45",
    "gpt_oss": "harmony",
    "deepseek_v3": "deepseek_v3",
    "minimax_m2": "minimax_m2",
}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The tool parser class registered as ``name`` (construct it per response)."""
    try:
        module, cls = TOOL_PARSERS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {sorted(TOOL_PARSERS)}") from None
    parser: type[ToolParser] = getattr(importlib.import_module(module), cls)
    return parser


def parser_for_model_type(model_type: str) -> str:
    """Default tool-parser name for an HF ``model_type``.

    NOTE: Qwen3-Coder-30B-A3B is ``qwen3_moe`` yet writes the XML format; a template
    check (``parser_for_chat_template``) or an explicit name overrides this default.
    """
    try:
        return _MODEL_TYPE_PARSER[model_type]
    except KeyError:
        raise ValueError(f"no default tool parser for model_type {model_type!r}") from None


def parser_for_chat_template(template: str) -> str | None:
    """The tool format a chat template teaches the model, if it teaches one we parse."""
    if "<|channel|>" in template and "<|message|>" in template:
        return "harmony"  # gpt-oss: markers no other format uses, so checked first
    if "<｜tool▁calls▁begin｜>" in template:
        return "deepseek_v3"  # DeepSeek's markers (fullwidth bars) are no other format's either
    if "<minimax:tool_call>" in template:
        return "minimax_m2"  # MiniMax-M2's block; its `<parameter name=` is not Qwen3-Coder's `<parameter=`
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<arg_key>" in template and "<arg_value>" in template:
        return "glm45"  # before hermes: GLM's calls open with `<tool_call>` too
    if "<tool_call>" in template:
        return "hermes"
    return None


def pick_tool_format(explicit: str | None, template_source: str, model_type: str) -> str | None:
    """The format a served model's output is parsed in (the server and `edgemoe chat` alike):
    the explicit flag, else the one the template teaches, else the family's default."""
    if explicit is not None:
        return explicit
    from_template = parser_for_chat_template(template_source) if template_source else None
    if from_template is not None:
        return from_template
    try:
        return parser_for_model_type(model_type)
    except ValueError:
        return None


__all__ = [
    "AnswerTagResponseParser",
    "KEEPS_SPECIAL_TOKENS",
    "TOOL_PARSERS",
    "WHOLE_OUTPUT_FORMATS",
    "ParsedDelta",
    "ParsedMessage",
    "ReasoningParser",
    "ResponseParser",
    "ThinkReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "accumulate",
    "close_open_reasoning",
    "pick_tool_format",
    "get_tool_parser",
    "parser_for_chat_template",
    "parser_for_model_type",
    "prompt_opens_reasoning",
    "strips_answer_tags",
]
