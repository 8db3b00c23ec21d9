"""The Responses API request (the stateless subset Codex uses) and its translation to chat.

Input items become OpenAI chat messages, the form every template takes:

- `message` (also without `type`): roles user/developer/system/assistant; content a
  string or `input_text`/`output_text`/`refusal` parts (joined with "\\n"); images and
  files are refused (a text-only model).
- `function_call {call_id, name, arguments}` joins the assistant message right before it
  (a model turn is `[reasoning] [message] [function_call…]`), else starts one.
- `function_call_output {call_id, output}` becomes a `tool` message.
- `reasoning {content | encrypted_content | summary}` (the first readable, never several:
  they carry the same text) becomes the next assistant message's `reasoning_content`
  (templates keep it only where the model would see it again).
- other items (records of hosted tools) are skipped; `item_reference` cannot be resolved
  by a server that stores nothing, so it is refused, like `previous_response_id`.

Tools: flat function tools become chat tools; every other tool type is skipped, never
refused (Codex always sends some).

`include` (the SDK's `ResponseIncludable`): `message.output_text.logprobs` and
`reasoning.encrypted_content` are honoured (responses.py); the others ask for parts of
hosted-tool items and image inputs, which this server never produces (images are
refused), so there is never anything to add: accepted, as the real API accepts them for
a response that used no such tool. An unknown value is a 400 naming it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict

from edgemoe.server.allowed_tools import restrict
from edgemoe.server.errors import bad_request
from edgemoe.server.limits import MAX_TOKEN_COUNT, Range
from edgemoe.server.names import Names
from edgemoe.server.protocol import (
    Flag,
    Logprobs,
    Probability,
    RepetitionPenalty,
    Seed,
    Temperature,
    TokenCount,
    TopK,
    TopP,
)
from edgemoe.server.tool_functions import check_function, check_names

Includable = Literal[
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url", "code_interpreter_call.outputs",
    "reasoning.encrypted_content", "message.output_text.logprobs",
]
SummaryMode = Literal["auto", "concise", "detailed", "none"]
# NOTE: the SDK gives no bounds; a negative count means nothing, and 0 (no hosted-tool
# calls) is what this server does anyway.
ToolCallCount = Annotated[int, Range(0, MAX_TOKEN_COUNT)]
_VERBOSITY = ("low", "medium", "high")
# `encrypted_content` of our reasoning items: the text itself (nothing here is secret from
# the client that reads `content` anyway), marked so that another server's blob is never
# read back as reasoning text.
_SEAL = "edgemoe-reasoning-v1:"

_TEXT_PARTS = Names({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})
_ROLES = Names({"user", "developer", "system", "assistant"})
# Items that only record what hosted tools did: nothing a template can show.
_SKIPPED_ITEMS = Names({
    "web_search_call", "file_search_call", "computer_call", "computer_call_output", "image_generation_call",
    "code_interpreter_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
    "local_shell_call", "local_shell_call_output", "custom_tool_call", "custom_tool_call_output",
    "tool_search_call", "tool_search_output", "additional_tools", "compaction",
})


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ReasoningConfig(_Request):
    effort: str | None = None
    # The SDK's three, and "none": Codex's way of asking for none (`model_reasoning_summary`).
    summary: SummaryMode | None = None
    generate_summary: SummaryMode | None = None  # `summary`'s deprecated name (the SDK keeps it)

    def summary_mode(self) -> str | None:
        """The summary asked for (auto / concise / detailed), None for none; echoed as such,
        since the SDK's response type has no "none"."""
        mode = self.summary or self.generate_summary
        return None if mode == "none" else mode


class ResponsesRequest(_Request):
    """`POST /v1/responses`. Unknown fields (`store`, `truncation`, `user`, `service_tier` …)
    are accepted and have no effect."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: Flag = False
    store: bool | None = None
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    # Server-side state too (a stored conversation, a stored prompt): refused like
    # previous_response_id, not ignored, or the model would answer without that context.
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    text: dict[str, Any] | None = None
    include: list[Includable] | None = None
    top_logprobs: Logprobs | None = None
    # Counts hosted ("built-in") tool calls only, per the SDK: this server runs none, so any
    # cap holds; function calls are not capped by it (nor by OpenAI). Checked and echoed.
    max_tool_calls: ToolCallCount | None = None
    # Extensions shared by local servers (vLLM, SGLang).
    top_k: TopK | None = None
    min_p: Probability | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Seed | None = None

    def function_tools(self) -> list[dict[str, Any]]:
        """The flat function tools as given (echoed in the response); 400 for one whose
        fields are not what Chat Completions' function takes (`check_function`), or whose
        name is empty or another function tool's (`check_names`)."""
        tools, names = [], []
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") == "function":
                check_function(tool, f"tools[{i}]")
                tools.append(tool)
                names.append((tool["name"], f"tools[{i}].name"))
        check_names(names)
        return tools

    def logprobs(self) -> int | None:
        """Alternatives per token when `include` asks for the message text's logprobs, else
        None. As the real API: `top_logprobs` alone only sizes them (it answers `logprobs: []`
        then), so a client's default of it does not make every step pay for them."""
        if "message.output_text.logprobs" in (self.include or ()):
            return self.top_logprobs or 0
        return None

    def seals_reasoning(self) -> bool:
        return "reasoning.encrypted_content" in (self.include or ())

    def summary_mode(self) -> str | None:
        return self.reasoning.summary_mode() if self.reasoning else None

    def verbosity(self) -> str | None:
        """`text.verbosity` (400 unless low / medium / high). It reaches templates that
        read it, as `reasoning.effort` does; the others have no such switch."""
        value = self.text.get("verbosity") if isinstance(self.text, dict) else None
        if value is not None and value not in _VERBOSITY:
            got = json.dumps(value) if isinstance(value, (str, int, float, bool)) else type(value).__name__
            raise bad_request(f"text.verbosity must be 'low', 'medium' or 'high' (got {got[:80]})",
                              param="text.verbosity")
        return value

    def chat_tools(self) -> list[dict[str, Any]] | None:
        tools = [
            {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}}
            for t in self.function_tools()
        ]
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            entries = choice.get("tools")
            if not isinstance(entries, list):
                raise bad_request("tool_choice.tools: an allowed_tools choice needs a list of tools",
                                  param="tool_choice.tools")
            return restrict(tools, entries, "tool_choice.tools")
        return tools or None

    def tool_choice_mode(self) -> tuple[str, str | None]:
        """(`none`/`auto`/`required`, a named function or None)."""
        choice = self.tool_choice
        if choice is None:
            return "auto", None
        if isinstance(choice, str):
            if choice not in ("none", "auto", "required"):
                raise bad_request(f"tool_choice: unknown value {choice!r}", param="tool_choice")
            return choice, None
        kind = choice.get("type")
        if kind == "function":
            name = choice.get("name")
            if not isinstance(name, str):
                raise bad_request("tool_choice: a function choice needs a 'name'", param="tool_choice.name")
            return "required", name
        if kind == "allowed_tools":
            if choice.get("mode") not in ("auto", "required"):
                raise bad_request("tool_choice.mode: an allowed_tools choice needs a mode, 'auto' or 'required'",
                                  param="tool_choice.mode")
            return str(choice["mode"]), None
        return "auto", None  # a hosted tool: we have none, so let the model choose

    def chat_messages(self) -> list[dict[str, Any]]:
        if self.previous_response_id is not None:
            raise bad_request(
                "previous_response_id is not supported: this server stores no responses; send the whole "
                "conversation in 'input'", param="previous_response_id",
            )
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise bad_request(f"{name} is not supported: this server stores no {name}s; send the whole "
                                  "conversation in 'input' (and the instructions in 'instructions')", param=name)
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        if not self.input:  # else the chat template's error would name the chat route's `messages`
            raise bad_request("input is an empty list: send at least one input item", param="input")
        builder = _Conversation(messages)
        for index, item in enumerate(self.input):
            builder.add(item, f"input[{index}]")
        return builder.messages


class _Conversation:
    """Folds input items into chat messages (see the module docstring)."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self._reasoning: list[str] = []  # reasoning items waiting for their assistant message

    def add(self, item: Mapping[str, Any], where: str) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            self._function_call(item, where)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _parts_text(output, f"{where}.output")
            self.messages.append({"role": "tool", "tool_call_id": _str(item, "call_id", where), "content": text})
        elif kind == "reasoning":
            text = _reasoning_text(item, where)
            if text:
                self._reasoning.append(text)
        elif kind == "item_reference":
            raise bad_request(
                "item_reference is not supported: this server stores no items; send them in full", param=where)
        elif kind not in _SKIPPED_ITEMS:
            raise bad_request(f"{where}: unknown input item type {kind!r}", param=f"{where}.type")

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in _ROLES:
            raise bad_request(f"{where}.role: must be one of user, developer, system, assistant", param=f"{where}.role")
        content = item.get("content")
        text = content if isinstance(content, str) else _parts_text(content, f"{where}.content")
        if role == "assistant":
            self.messages.append(self._assistant(text))
        else:
            self._reasoning.clear()  # reasoning belongs to the model turn it preceded
            self.messages.append({"role": role, "content": text})

    def _function_call(self, item: Mapping[str, Any], where: str) -> None:
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != "assistant" or self._reasoning:
            last = self._assistant("")
            self.messages.append(last)
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        last.setdefault("tool_calls", []).append({
            "id": _str(item, "call_id", where), "type": "function",
            "function": {"name": _str(item, "name", where), "arguments": arguments},
        })

    def _assistant(self, text: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self._reasoning:
            message["reasoning_content"] = "\n".join(self._reasoning)
            self._reasoning = []
        return message


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    """One of the item's forms, never several: our summary is the same text as its `content`
    and its sealed `encrypted_content`, and clients send back all three. The full text comes
    first; a summary (another server's is a digest) only when nothing else is readable."""
    return (_parts_text(item.get("content") or [], f"{where}.content") or unseal(item.get("encrypted_content"))
            or _parts_text(item.get("summary") or [], f"{where}.summary"))


def _str(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key}: field required (a string)", param=f"{where}.{key}")
    return value


def _parts_text(parts: object, where: str) -> str:
    if parts is None:
        return ""
    if not isinstance(parts, list):
        raise bad_request(f"{where}: must be a string or a list of content parts", param=where)
    texts: list[str] = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS:
            text = part.get("text", part.get("refusal")) if isinstance(part, Mapping) else None
            if isinstance(text, str):
                texts.append(text)
                continue
            raise bad_request(f"{where}[{i}].text: a {kind!r} part needs its text (a string)",
                              param=f"{where}[{i}].text")
        if kind in ("input_image", "input_file", "input_audio", "image"):
            raise bad_request(f"{where}[{i}]: content of type {kind!r} is not supported: this is a text-only model",
                              param=f"{where}[{i}]", code="unsupported_content")
        raise bad_request(f"{where}[{i}]: unsupported content part {kind!r}", param=f"{where}[{i}].type")
    return "\n".join(texts)


def seal(text: str) -> str:
    return _SEAL + base64.b64encode(text.encode()).decode()


def unseal(blob: object) -> str:
    """Our own `encrypted_content` read back (a client that kept only it); "" for another's."""
    if not isinstance(blob, str) or not blob.startswith(_SEAL):
        return ""
    try:
        return base64.b64decode(blob[len(_SEAL):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""
