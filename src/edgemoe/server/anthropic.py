"""Anthropic Messages: a `CreateMessageRequest` → a `GenerationRequest`; events → a message or SSE.

One `BlockBuilder` turns the neutral events into content blocks and, for each change,
the stream event announcing it, so the non-streamed message is the streamed one
without its events. Blocks open in the order the model produces them (thinking, text,
tool_use; text after a call opens a new text block).

Stream: `message_start` (usage with the input tokens) → `ping` → per block
`content_block_start` / `content_block_delta`* / `content_block_stop` → `message_delta`
(stop reason, cumulative usage) → `message_stop`. A thinking block starts with
`signature: ""` and gets its `signature_delta` just before it stops (the SDK types the
field as required). An engine failure midway is an `event: error`.

Usage follows Anthropic's accounting: `input_tokens` are the prompt tokens *not* read
from the prefix cache, `cache_read_input_tokens` the ones that were (Claude Code adds
them up for its context gauge); `cache_creation_input_tokens` is always 0.

`/v1/models` answers an Anthropic client (one that sends `anthropic-version`) with
Anthropic's model list (`type`, `display_name`, `created_at`, `has_more`, …): Claude
Code's gateway model discovery and the SDK's `models.list()` read only that shape.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgemoe.server.anthropic_errors import anthropic_error_frame
from edgemoe.server.anthropic_protocol import (
    CountTokensRequest,
    CreateMessageRequest,
    tool_input,
)
from edgemoe.server.disconnect import unless_disconnected
from edgemoe.server.errors import APIError, bad_request
from edgemoe.server.events import (
    ChoiceDone,
    Done,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from edgemoe.server.generation import (
    Generation,
    count_prompt_tokens,
    sampling_params,
    start_generation,
)
from edgemoe.server.generation_request import ChatPrompt, GenerationRequest
from edgemoe.server.heartbeat import ANTHROPIC_PING, with_heartbeat
from edgemoe.server.model import ServedModel
from edgemoe.server.output_format import anthropic_output_format
from edgemoe.server.sse import event_frame, sse_response
from edgemoe.server.state import ServerState

Frame = dict[str, Any]
_INTERLEAVED_BETA = "interleaved-thinking"
ANTHROPIC_VERSION = "anthropic-version"  # the header every Anthropic client sends


def to_generation_request(
    req: CountTokensRequest, model: ServedModel, *, max_tokens: int | None = None,
    stop: list[str] | None = None, temperature: float | None = None, top_p: float | None = None,
    top_k: int | None = None,
) -> GenerationRequest:
    """The same translation serves /v1/messages and count_tokens, so both render one prompt."""
    messages, prefill = req.conversation()
    req.check_forced_tool_use(prefill)
    tool_choice, named, parallel = req.tool_mode()
    params = sampling_params(model, max_tokens=max_tokens, stop=stop or [], temperature=temperature,
                             top_p=top_p, top_k=top_k)
    output_format = anthropic_output_format(req.output_config, req.output_format)
    if output_format is not None and prefill:
        raise bad_request("structured outputs cannot continue a prefilled assistant turn", param="messages")
    return GenerationRequest(
        prompt=ChatPrompt(messages, continuation=prefill),
        params=params,
        # A prefilled turn continues the given text: it cannot open a think block first.
        thinking=False if prefill else req.thinking_switch(),
        tools=req.chat_tools(),
        tool_choice=tool_choice,
        named_tool=named,
        parallel_tool_calls=parallel,
        field_names={"stop": "stop_sequences"},
        output_format=output_format,
    )


def usage_body(prompt_tokens: int, cached: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def stop_reason(done: ChoiceDone | None, stop_sequences: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for how the choice ended."""
    if done is None:
        return "end_turn", None
    if done.finish_reason == "tool_calls":
        return "tool_use", None
    if done.finish_reason == "length":
        return "max_tokens", None
    if isinstance(done.stop_reason, str) and done.stop_reason in stop_sequences:
        return "stop_sequence", done.stop_reason
    return "end_turn", None


def signature(thinking: str) -> str:
    """An opaque signature for a thinking block (clients echo it; we accept any)."""
    return hashlib.sha256(thinking.encode()).hexdigest()[:32]


class BlockBuilder:
    """Events → content blocks + stream frames."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []  # finished blocks, in order
        self.done: ChoiceDone | None = None
        self.usage: Done | None = None
        self._open: dict[str, Any] | None = None
        self._json = ""  # the open tool_use block's arguments so far

    def feed(self, event: Event) -> list[Frame]:
        if isinstance(event, ReasoningDelta):
            return self._delta("thinking", {"type": "thinking_delta", "thinking": event.text}, event.text)
        if isinstance(event, TextDelta):
            return self._delta("text", {"type": "text_delta", "text": event.text}, event.text)
        if isinstance(event, ToolCallStart):
            call_id = "toolu_" + event.id.removeprefix("call_")
            return [*self.close(), *self._start({"type": "tool_use", "id": call_id, "name": event.name, "input": {}})]
        if isinstance(event, ToolCallArgumentsDelta) and self._open is not None and self._open["type"] == "tool_use":
            # NOTE: parsers finish one call's arguments before the next call starts.
            self._json += event.arguments
            return [self._frame_delta({"type": "input_json_delta", "partial_json": event.arguments})]
        if isinstance(event, ChoiceDone):
            self.done = event
            return self.close()
        if isinstance(event, Done):
            self.usage = event
        return []

    def _delta(self, kind: str, delta: Frame, text: str) -> list[Frame]:
        frames: list[Frame] = []
        if self._open is None or self._open["type"] != kind:
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
            frames = [*self.close(), *self._start(start)]
        assert self._open is not None
        self._open[kind] += text
        return [*frames, self._frame_delta(delta)]

    def _start(self, block: dict[str, Any]) -> list[Frame]:
        self._open = dict(block)
        return [{"type": "content_block_start", "index": len(self.blocks), "content_block": block}]

    def _frame_delta(self, delta: Frame) -> Frame:
        return {"type": "content_block_delta", "index": len(self.blocks), "delta": delta}

    def close(self) -> list[Frame]:
        block, self._open = self._open, None
        if block is None:
            return []
        frames: list[Frame] = []
        if block["type"] == "thinking":
            block["signature"] = signature(block["thinking"])
            frames.append(self._frame_delta({"type": "signature_delta", "signature": block["signature"]}))
        elif block["type"] == "tool_use":
            block["input"], self._json = tool_input(self._json), ""
        frames.append({"type": "content_block_stop", "index": len(self.blocks)})
        self.blocks.append(block)
        return frames


# --------------------------------------------------------------------------- routes


def _interleaved(request: Request) -> bool:
    return _INTERLEAVED_BETA in request.headers.get("anthropic-beta", "")


async def create_message(state: ServerState, req: CreateMessageRequest, request: Request) -> Response:
    model = state.serving(req.model)
    req.check_thinking_budget(_interleaved(request))
    # In a worker: a conversation of many blocks takes a while to convert.
    gen_req = await anyio.to_thread.run_sync(functools.partial(
        to_generation_request, req, model, max_tokens=req.max_tokens, stop=req.stop_sequences,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
    ))
    beat = state.config.stream_heartbeat
    gen = await start_generation(state.client, model, gen_req, default_thinking=state.config.thinking_default,
                                 first_output_wait=beat if req.stream else None)
    message_id = f"msg_{uuid.uuid4().hex}"
    if req.stream:
        frames = _stream(gen, req, message_id)
        return sse_response(with_heartbeat(frames, ANTHROPIC_PING, beat, ping_first=gen.pending))
    builder = await unless_disconnected(request, _collect(gen))
    return JSONResponse(_message(message_id, req, builder, gen))


async def count_tokens(state: ServerState, req: CountTokensRequest) -> dict[str, int]:
    model = state.serving(req.model)
    gen_req = await anyio.to_thread.run_sync(to_generation_request, req, model)
    thinking = gen_req.thinking if gen_req.thinking is not None else state.config.thinking_default
    return {"input_tokens": await anyio.to_thread.run_sync(count_prompt_tokens, model, gen_req, thinking)}


def anthropic_model_card(model_id: str, model: ServedModel) -> dict[str, Any]:
    """`GET /v1/models/{id}` in Anthropic's shape (the SDK's `ModelInfo`)."""
    created = datetime.fromtimestamp(model.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": model_id, "display_name": model_id, "created_at": created,
            "lifecycle": "active", "max_input_tokens": model.max_model_len}


def anthropic_model_list(model: ServedModel) -> dict[str, Any]:
    """`GET /v1/models` in Anthropic's shape: one page, every model on it."""
    return {"data": [anthropic_model_card(model.name, model)], "has_more": False,
            "first_id": model.name, "last_id": model.name}


async def _collect(gen: Generation) -> BlockBuilder:
    builder = BlockBuilder()
    async for event in gen.events():
        builder.feed(event)
    return builder


def _message(message_id: str, req: CreateMessageRequest, builder: BlockBuilder, gen: Generation) -> dict[str, Any]:
    reason, sequence = stop_reason(builder.done, req.stop_sequences or [])
    usage = builder.usage.usage if builder.usage else None
    output = usage.completion_tokens if usage else 0
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": req.model, "content": builder.blocks,
        "stop_reason": reason, "stop_sequence": sequence,
        "usage": usage_body(gen.prompt_tokens, gen.cached_tokens, output),
    }


async def _stream(gen: Generation, req: CreateMessageRequest, message_id: str) -> AsyncIterator[bytes]:
    builder = BlockBuilder()
    try:
        await gen.wait_first()  # message_start reports the cached prompt tokens
        start = {
            "id": message_id, "type": "message", "role": "assistant", "model": req.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": usage_body(gen.prompt_tokens, gen.cached_tokens, 0),
        }
        yield event_frame("message_start", {"type": "message_start", "message": start})
        yield event_frame("ping", {"type": "ping"})
        async for event in gen.events():
            for frame in builder.feed(event):
                yield event_frame(frame["type"], frame)
        reason, sequence = stop_reason(builder.done, req.stop_sequences or [])
        output = builder.usage.usage.completion_tokens if builder.usage else 0
        yield event_frame("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_body(gen.prompt_tokens, gen.cached_tokens, output),
        })
        yield event_frame("message_stop", {"type": "message_stop"})
    except APIError as err:  # the engine failed midway: tell the client, then close
        yield anthropic_error_frame(err)
    finally:
        gen.close()
