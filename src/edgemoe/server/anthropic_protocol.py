"""The Anthropic Messages request and its translation to OpenAI chat messages.

Blocks → chat messages (the form every template takes):

- `system`: a string or text blocks (joined with a blank line; `cache_control` ignored).
  Claude Code's per-request `x-anthropic-billing-header: …` line is removed first: it
  changes every request and would end the shared prefix at the system prompt.
- user `text` → a user message; `tool_result {tool_use_id, content, is_error}` → a
  `tool` message (content a string or text blocks; an error is prefixed "Error: ");
  blocks keep their order. `image`/`document`: 400 (a text-only model).
- assistant `text` → content, `thinking` → `reasoning_content` (any signature is
  accepted), `redacted_thinking` is dropped (nothing readable), `tool_use` → a tool call.
- a `system` message inside `messages` (Claude Code's mid-conversation-system beta)
  stays a system message in place (templates render later ones where they stand).
- A final assistant message is a prefill: the prompt ends with its text and the model
  continues it (as the real API does); its trailing whitespace is refused likewise.

Validation follows the real API where clients depend on it: `model`, `max_tokens` (an
integer ≥ 1) and `messages` are required; `thinking.budget_tokens` ≥ 1024 and below
`max_tokens` (unless the interleaved-thinking beta is on); a `tool_choice` that forces a
call (`any`/`tool`) with thinking enabled (the real API's message) or after a prefill.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict

from edgemoe.server.errors import APIError, bad_request
from edgemoe.server.limits import MAX_TOKEN_COUNT, Range, StopStrings
from edgemoe.server.names import Names
from edgemoe.server.protocol import Flag, TokenCount
from edgemoe.server.tool_functions import check_function, check_names

BILLING_HEADER = "x-anthropic-billing-header"
_MIN_THINKING_BUDGET = 1024
_UNSUPPORTED_BLOCKS = Names({"image", "document", "search_result", "container_upload"})


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ThinkingConfig(_Request):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Range(0, MAX_TOKEN_COUNT)] | None = None


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class InputMessage(_Request):
    # "system" mid-conversation: Claude Code's `mid-conversation-system-…` beta.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Request):
    """`POST /v1/messages/count_tokens`: what shapes the prompt, nothing about sampling."""

    model: str
    messages: list[InputMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    # Structured outputs (server/output_format.py checks them, naming the place).
    output_config: Any = None
    output_format: Any = None

    def thinking_switch(self) -> bool | None:
        """The request's thinking decision; None leaves it to --default-thinking-mode."""
        if self.thinking is None:
            return None
        return self.thinking.type != "disabled"

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """Custom tools as chat tools; server tools (typed `web_search_…`, `bash_…`) are skipped."""
        # Server tools' names count too: the real API refuses a custom tool named as one.
        check_names((tool.get("name") if isinstance(tool, dict) else None, f"tools[{i}].name")
                    for i, tool in enumerate(self.tools or []))
        tools = []
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") not in (None, "custom"):
                continue
            if not isinstance(tool.get("name"), str):
                raise bad_request(f"tools.{i}.name: Field required", param=f"tools[{i}].name")
            check_function(tool, f"tools[{i}]", parameters="input_schema")
            function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            if tool.get("strict") is True:
                function["strict"] = True
            tools.append({"type": "function", "function": function})
        return tools or None

    def tool_mode(self) -> tuple[str, str | None, bool]:
        """(chat tool_choice, named tool or None, parallel tool calls allowed)."""
        choice = self.tool_choice
        if choice is None:
            return "auto", None, True
        parallel = choice.disable_parallel_tool_use is not True
        if choice.type == "tool":
            if choice.name is None:
                raise bad_request("tool_choice.name: Field required", param="tool_choice.name")
            return "required", choice.name, parallel
        return {"auto": "auto", "any": "required", "none": "none"}[choice.type], None, parallel

    def check_forced_tool_use(self, prefill: str) -> None:
        """Refuse a `tool_choice` that forces a call (`any`/`tool`) with thinking enabled, as
        the real API does, and after a prefill: the forced call must open the turn."""
        if self.tool_choice is None or self.tool_choice.type not in ("any", "tool"):
            return
        if self.thinking is not None and self.thinking.type == "enabled":
            raise bad_request("Thinking may not be enabled when tool_choice forces tool use.", param="tool_choice")
        if prefill:
            raise bad_request(f"tool_choice: {self.tool_choice.type!r} forces a tool call to open the turn, so the "
                              "last message cannot be an assistant prefill", param="tool_choice")

    def conversation(self) -> tuple[list[dict[str, Any]], str]:
        """(chat messages, prefill text) — the prefill is '' unless the last message is the assistant's."""
        if not self.messages:
            raise bad_request("messages: at least one message is required", param="messages")
        messages: list[dict[str, Any]] = []
        system = system_text(self.system)
        if system:
            messages.append({"role": "system", "content": system})
        prefill = ""
        for index, message in enumerate(self.messages):
            where = f"messages.{index}"
            if message.role == "user":
                messages.extend(_user_messages(message.content, where))
            elif message.role == "system":
                messages.append({"role": "system", "content": system_text(message.content)})
            elif index == len(self.messages) - 1 and _is_prefill(message.content):
                prefill = _prefill_text(message.content, where)
            else:
                messages.append(_assistant_message(message.content, where))
        return messages, prefill


class CreateMessageRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: TokenCount
    stop_sequences: Annotated[list[str], StopStrings()] | None = None
    stream: Flag = False
    temperature: Annotated[float, Range(0, 1)] | None = None
    top_p: Annotated[float, Range(0, 1, lo_open=True)] | None = None
    top_k: Annotated[int, Range(0, MAX_TOKEN_COUNT)] | None = None

    def check_thinking_budget(self, interleaved: bool) -> None:
        thinking = self.thinking
        if thinking is None or thinking.type != "enabled":
            return
        budget = thinking.budget_tokens
        if budget is None:
            raise bad_request("thinking.enabled.budget_tokens: Field required", param="thinking.budget_tokens")
        if budget < _MIN_THINKING_BUDGET:
            raise bad_request(
                f"thinking.enabled.budget_tokens: Input should be greater than or equal to {_MIN_THINKING_BUDGET}",
                param="thinking.budget_tokens",
            )
        if budget >= self.max_tokens and not interleaved:
            raise bad_request("`max_tokens` must be greater than `thinking.budget_tokens`", param="max_tokens")


def system_text(system: str | list[dict[str, Any]] | None) -> str:
    """The system prompt as one text, without Claude Code's billing line."""
    if system is None:
        return ""
    blocks = [system] if isinstance(system, str) else [_block_text(b, f"system.{i}") for i, b in enumerate(system)]
    kept = [strip_billing_header(text) for text in blocks]
    return "\n\n".join(text for text in kept if text.strip())


def strip_billing_header(text: str) -> str:
    """Remove `x-anthropic-billing-header: …` lines (they differ in every request)."""
    if BILLING_HEADER not in text:
        return text
    lines = text.split("\n")
    return "\n".join(line for line in lines if not line.lstrip().lower().startswith(BILLING_HEADER))


def _block_text(block: object, where: str) -> str:
    if isinstance(block, Mapping) and block.get("type") == "text":
        if isinstance(block.get("text"), str):
            return block["text"]
        raise bad_request(f"{where}.text: a text block needs a string 'text' (got {block.get('text')!r})",
                          param=f"{where}.text")
    kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
    raise _block_error(kind, where)


def _block_error(kind: object, where: str) -> APIError:
    if kind in _UNSUPPORTED_BLOCKS:
        return bad_request(f"{where}: content of type {kind!r} is not supported: this is a text-only model",
                           param=where, code="unsupported_content")
    return bad_request(f"{where}.type: unsupported content block type {kind!r}", param=f"{where}.type")


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _user_messages(content: str | list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, block in enumerate(_blocks(content)):
        if block.get("type") == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_message(block, f"{where}.content.{i}"))
        else:
            texts.append(_block_text(block, f"{where}.content.{i}"))
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_message(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str):
        raise bad_request(f"{where}.tool_use_id: Field required", param=f"{where}.tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(_block_text(b, f"{where}.content.{i}") for i, b in enumerate(content))
    else:
        raise bad_request(f"{where}.content: must be a string or a list of blocks", param=f"{where}.content")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _assistant_message(content: str | list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content)):
        kind, at = block.get("type"), f"{where}.content.{i}"
        if kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted by another provider: nothing a template could show
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        else:
            texts.append(_block_text(block, at))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    for key in ("id", "name"):
        if not isinstance(block.get(key), str):
            raise bad_request(f"{where}.{key}: Field required", param=f"{where}.{key}")
    arguments = block.get("input", {})
    if not isinstance(arguments, Mapping):
        raise bad_request(f"{where}.input: Input should be a valid dictionary", param=f"{where}.input")
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": dict(arguments)}}


def _is_prefill(content: str | list[dict[str, Any]]) -> bool:
    return all(b.get("type") in ("text", "thinking", "redacted_thinking") for b in _blocks(content))


def _prefill_text(content: str | list[dict[str, Any]], where: str) -> str:
    text = "".join(b["text"] for b in _blocks(content) if b.get("type") == "text" and isinstance(b.get("text"), str))
    if text != text.rstrip():
        raise bad_request("final assistant content cannot end with trailing whitespace", param=where)
    return text


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the `input` object (parsers emit JSON objects)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except (ValueError, RecursionError):  # also a too-long integer, too-deep nesting
        return {}
    return value if isinstance(value, dict) else {}
