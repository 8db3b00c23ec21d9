"""Pydantic request models of the OpenAI-style endpoints.

Unknown fields are ignored (`extra="ignore"`): clients send `store`, `metadata`,
`prompt_cache_key`, `user` … and must not be refused for it. Messages keep their
extra keys (`extra="allow"`) because chat templates may read them. Every number is
bounded here (`edgemoe.server.limits`), so a refusal names the client's own field;
cross-field rules (`min_tokens` ≤ `max_tokens`) are `SamplingParams.validate`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from edgemoe.messages import MAX_REPETITION_PENALTY, MAX_TEMPERATURE
from edgemoe.server.limits import (
    MAX_CHOICES,
    MAX_LOGPROBS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOKEN_COUNT,
    MAX_TOKEN_ID,
    SEED_MAX,
    SEED_MIN,
    LogitBiasMap,
    Range,
    StopStrings,
)
from edgemoe.server.tool_functions import check_names

# The bounded number types every protocol's fields use (edgemoe.server.limits).
Temperature = Annotated[float, Range(0, MAX_TEMPERATURE)]
TopP = Annotated[float, Range(0, 1, lo_open=True)]
Probability = Annotated[float, Range(0, 1)]
Penalty = Annotated[float, Range(-2, 2)]
RepetitionPenalty = Annotated[float, Range(0, MAX_REPETITION_PENALTY, lo_open=True)]
TopK = Annotated[int, Range(-1, MAX_TOKEN_COUNT)]
Seed = Annotated[int, Range(SEED_MIN, SEED_MAX, label="a 64-bit signed integer")]
TokenCount = Annotated[int, Range(1, MAX_TOKEN_COUNT)]
MinTokens = Annotated[int, Range(0, MAX_TOKEN_COUNT)]
TokenId = Annotated[int, Range(0, MAX_TOKEN_ID)]
Logprobs = Annotated[int, Range(0, MAX_LOGPROBS)]
Choices = Annotated[int, Range(1, MAX_CHOICES)]
Stop = Annotated[str | list[str], StopStrings()]


LogitBias = Annotated[dict[int, float], LogitBiasMap()]


def _null_is(default: object) -> BeforeValidator:
    return BeforeValidator(lambda value: default if value is None else value)


# `null` means the default: OpenAI's spec makes `stream`, `n`, `logprobs`, `echo`
# nullable, and clients generated from the specs send null for what they leave unset.
Flag = Annotated[bool, _null_is(False)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionDefinition(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Request):
    """`{"type": "function", "function": {...}}`; other tool types are ignored."""

    type: str = "function"
    function: FunctionDefinition | None = None

    @model_validator(mode="after")
    def _function_needs_definition(self) -> ChatTool:
        if self.type == "function" and self.function is None:
            raise ValueError("a function tool needs a 'function' object")
        return self


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(_Request):
    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]  # `{type: "function", function: {name}}` (server/allowed_tools.py)


class AllowedToolsChoice(_Request):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class StreamOptions(_Request):
    include_usage: bool = False


class ChatMessage(BaseModel):
    """One message; assistant `content` may be null when it has `tool_calls`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any] | str] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class SamplingFields(_Request):
    """Sampling fields Chat Completions and Completions share (OpenAI's and local servers')."""

    model: str | None = None
    n: Annotated[Choices, _null_is(1)] = 1
    stream: Flag = False
    stream_options: StreamOptions | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Extensions shared by local servers (vLLM, SGLang, llama.cpp).
    top_k: TopK | None = None
    min_p: Probability | None = None
    min_tokens: MinTokens | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    skip_special_tokens: bool | None = None
    logit_bias: LogitBias | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: Flag = False
    top_logprobs: Logprobs | None = None
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: Any = None  # checked by server/output_format.py (its errors name the place)

    def function_tools(self) -> list[dict[str, Any]] | None:
        """The function tools; 400 for an empty or repeated name (`check_names`)."""
        check_names((t.function.name, f"tools[{i}].function.name")
                    for i, t in enumerate(self.tools or []) if t.type == "function" and t.function is not None)
        tools = [t.model_dump(exclude_none=True) for t in self.tools or [] if t.type == "function"]
        return tools or None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    response_format: Any = None  # vLLM's extension: as chat's (server/output_format.py)
    echo: Flag = False
    logprobs: Logprobs | None = None
    max_tokens: TokenCount | None = 16
    suffix: str | None = None
    best_of: Choices | None = None


class TokenizeRequest(_Request):
    """`{model, prompt}` or `{model, messages[, tools]}`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]
