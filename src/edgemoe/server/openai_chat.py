"""Chat Completions: the request → a `GenerationRequest`; events → a response or SSE chunks.

Stream shape (what the openai SDK and agents rely on, see API-NOTES): a first chunk
per choice with `{role: "assistant", content: ""}`; then content, reasoning
(`reasoning_content` and `reasoning`) and tool-call deltas (`index` on every one;
`id`, `type`, `name` on a call's first); a last chunk per choice with an empty delta
and its `finish_reason`; a `{choices: [], usage}` chunk only with
`stream_options.include_usage`; then `data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgemoe.messages import TokenLogprob
from edgemoe.server.allowed_tools import restrict
from edgemoe.server.disconnect import unless_disconnected
from edgemoe.server.errors import APIError
from edgemoe.server.events import (
    ChoiceDone,
    ChoiceResult,
    Done,
    Event,
    ReasoningDelta,
    TextDelta,
    TokensDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
    Usage,
)
from edgemoe.server.generation import (
    Generation,
    sampling_params,
    start_generation,
    thinking_from,
)
from edgemoe.server.generation_request import ChatPrompt, GenerationRequest
from edgemoe.server.heartbeat import COMMENT_PING, with_heartbeat
from edgemoe.server.logprobs import TokenTexts
from edgemoe.server.model import ServedModel
from edgemoe.server.output_format import chat_response_format
from edgemoe.server.protocol import AllowedToolsChoice, ChatCompletionRequest
from edgemoe.server.sse import DONE, data_frame, error_frame, sse_response
from edgemoe.server.state import ServerState


def to_generation_request(req: ChatCompletionRequest, model: ServedModel) -> GenerationRequest:
    tool_choice, named, tools = "auto", None, req.function_tools()
    if isinstance(req.tool_choice, str):
        tool_choice = req.tool_choice
    elif isinstance(req.tool_choice, AllowedToolsChoice):
        allowed = req.tool_choice.allowed_tools
        tool_choice, tools = allowed.mode, restrict(tools, allowed.tools, "tool_choice.allowed_tools.tools")
    elif req.tool_choice is not None:
        tool_choice, named = "required", req.tool_choice.function.name
    template_kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:  # templates that read it (gpt-oss's), unless the kwargs set it
        template_kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = sampling_params(
        model,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, seed=req.seed, max_tokens=max_tokens,
        min_tokens=req.min_tokens, ignore_eos=req.ignore_eos, stop=req.stop_list(),
        stop_token_ids=req.stop_token_ids, skip_special_tokens=req.skip_special_tokens,
        logit_bias=req.logit_bias or None,  # {}: no bias, no cost
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
    )
    return GenerationRequest(
        prompt=ChatPrompt([m.model_dump(exclude_none=True) for m in req.messages], template_kwargs),
        params=params,
        n=req.n,
        thinking=thinking_from(template_kwargs.get("enable_thinking"), req.reasoning_effort),
        tools=tools,
        tool_choice=tool_choice,
        named_tool=named,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        field_names={"max_tokens": "max_completion_tokens"} if req.max_completion_tokens is not None else {},
        output_format=chat_response_format(req.response_format),
    )


@dataclass(frozen=True)
class _Meta:
    """What every response and chunk of one request repeats."""

    id: str
    created: int
    model: str
    top_logprobs: int | None  # None: logprobs not requested
    tokens: TokenTexts

    def logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if self.top_logprobs is None or entries is None:
            return None
        return {"content": [self.tokens.chat_entry(lp, self.top_logprobs) for lp in entries], "refusal": None}


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request) -> Response:
    model = state.serving(req.model)
    gen_req = await anyio.to_thread.run_sync(to_generation_request, req, model)  # many messages: a while
    beat = state.config.stream_heartbeat
    gen = await start_generation(state.client, model, gen_req, default_thinking=state.config.thinking_default,
                                 first_output_wait=beat if req.stream else None)
    meta = _Meta(
        f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), req.model or model.name,
        gen_req.params.logprobs, model.tokens,
    )
    if req.stream:
        frames = _stream(gen, meta, req.n, req.include_usage())
        return sse_response(with_heartbeat(frames, COMMENT_PING, beat, ping_first=gen.pending))
    choices, usage = await unless_disconnected(request, gen.collect())
    return JSONResponse(_completion_body(meta, choices, usage))


# --------------------------------------------------------------------------- non-streamed


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _message(choice: ChoiceResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text or (None if choice.tool_calls else "")}
    if choice.reasoning:
        message["reasoning_content"] = choice.reasoning
        message["reasoning"] = choice.reasoning
    if choice.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in choice.tool_calls
        ]
    return message


def _completion_body(meta: _Meta, choices: list[ChoiceResult], usage: Usage) -> dict[str, Any]:
    return {
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [
            {
                "index": c.index,
                "message": _message(c),
                "logprobs": meta.logprobs(c.logprobs or []),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in choices
        ],
        "usage": usage_body(usage),
    }


# --------------------------------------------------------------------------- streamed


class _ChunkWriter:
    """Builds chunk frames; holds each choice's logprobs until its next chunk."""

    def __init__(self, meta: _Meta, include_usage: bool) -> None:
        self.meta = meta
        self.include_usage = include_usage
        self._pending: dict[int, list[TokenLogprob]] = {}

    def chunk(self, choice: int, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        entry: dict[str, Any] = {
            "index": choice,
            "delta": delta,
            "logprobs": self.meta.logprobs(self._pending.pop(choice, None)),
            "finish_reason": finish_reason,
            **extra,
        }
        body: dict[str, Any] = {
            "id": self.meta.id, "object": "chat.completion.chunk", "created": self.meta.created,
            "model": self.meta.model, "choices": [entry],
        }
        if self.include_usage:
            body["usage"] = None
        return data_frame(body)

    def frame(self, event: Event) -> bytes | None:
        """The chunk for one event (None: nothing to send yet)."""
        if isinstance(event, TokensDelta):
            if event.logprobs is not None:
                self._pending.setdefault(event.choice, []).extend(event.logprobs)
            return None
        if isinstance(event, TextDelta):
            return self.chunk(event.choice, {"content": event.text})
        if isinstance(event, ReasoningDelta):
            return self.chunk(event.choice, {"reasoning_content": event.text, "reasoning": event.text})
        if isinstance(event, ToolCallStart):
            call = {"index": event.index, "id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
            return self.chunk(event.choice, {"tool_calls": [call]})
        if isinstance(event, ToolCallArgumentsDelta):
            call = {"index": event.index, "function": {"arguments": event.arguments}}
            return self.chunk(event.choice, {"tool_calls": [call]})
        if isinstance(event, ChoiceDone):
            return self.chunk(event.choice, {}, event.finish_reason, stop_reason=event.stop_reason)
        if isinstance(event, Done) and self.include_usage:
            return data_frame({
                "id": self.meta.id, "object": "chat.completion.chunk", "created": self.meta.created,
                "model": self.meta.model, "choices": [], "usage": usage_body(event.usage),
            })
        return None


async def _stream(gen: Generation, meta: _Meta, n: int, include_usage: bool) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(meta, include_usage)
    try:
        for choice in range(n):
            yield writer.chunk(choice, {"role": "assistant", "content": ""})
        async for event in gen.events():
            frame = writer.frame(event)
            if frame is not None:
                yield frame
        yield DONE
    except APIError as err:
        yield error_frame(err)  # the engine failed midway: tell the client, then close
    finally:
        gen.close()
