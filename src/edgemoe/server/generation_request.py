"""The protocol-neutral request every API route builds (`generation.py` runs it): the
prompt in one of three forms, the sampling, the tools and how the output is parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgemoe.messages import SamplingParams
from edgemoe.server.output_format import OutputFormat


@dataclass(frozen=True)
class TokensPrompt:
    token_ids: list[int]


@dataclass(frozen=True)
class TextPrompt:
    text: str


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation in OpenAI chat-message dicts (each protocol converts to this)."""

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continuation: str = ""  # text the assistant's turn starts with (a prefill), after the template


Prompt = TokensPrompt | TextPrompt | ChatPrompt


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, protocol-neutral.

    `thinking`: None means the server's --default-thinking-mode (chat prompts only).
    `tools` are OpenAI function-tool dicts; `tool_choice` "none" hides them from the
    template and parser, "auto" parses calls, "required" and `named_tool` (a function
    name, one of them) force one (`forced_call`). Raw prompts (`parse_output=False`)
    skip all parsing. `output_format`: the output must be JSON (server/output_format.py).
    `strict_default`: a tool without `strict` has its calls held to its schema (the
    Responses API's default; Chat Completions' is not to), never refused (call_format.py).
    """

    prompt: Prompt
    params: SamplingParams
    n: int = 1
    thinking: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    named_tool: str | None = None
    parallel_tool_calls: bool = True
    parse_output: bool = True
    output_format: OutputFormat | None = None
    strict_default: bool = False
    prompt_param: str = "messages"  # the request field the prompt came from, for errors
    # SamplingParams field → the client's name for it, where they differ (for errors).
    field_names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    text: str | None  # None when the client sent token ids
    starts_in_reasoning: bool
    forced: str = ""  # the forced tool-call opening the prompt ends with (forced_call)
