"""Responses API: a `ResponsesRequest` → a `GenerationRequest`; events → a response or SSE.

One `OutputBuilder` turns the neutral events into output items and, for each change,
the stream event that announces it, so the non-streamed response is by construction
the streamed one without its events. Items open in the order the model produces them
(reasoning, message, function calls; text after a call opens a new message), each with
`output_item.added` … `output_item.done`. Stream frames are `event: TYPE` + `data`, with
a `sequence_number` counting every event from 0.

Reasoning items carry the thinking as one `reasoning_text` content part; when the request
asks for a summary (`reasoning.summary` auto/concise/detailed) also as one `summary_text`
part, with the summary events, since Codex shows reasoning only through summaries.

Logprobs (`include: ["message.output_text.logprobs"]` or `top_logprobs`): a token's
logprobs go to the next text delta after it (parsers may hold text back a while); tokens
followed by reasoning or a tool call instead are not the message's, and are dropped.

Ends: `response.completed`; `response.incomplete` (`max_output_tokens`) when the token
limit or the context cut the output; `response.failed` when the engine fails midway or,
for a streamed request, the prompt does not fit (`context_length_exceeded`, which Codex
reads as "context full").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgemoe.messages import TokenLogprob
from edgemoe.server.disconnect import unless_disconnected
from edgemoe.server.errors import APIError
from edgemoe.server.events import (
    ChoiceDone,
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
from edgemoe.server.responses_protocol import ResponsesRequest, seal
from edgemoe.server.sse import event_frame, sse_response
from edgemoe.server.output_format import responses_text_format
from edgemoe.server.state import ServerState

Frame = dict[str, Any]


def to_generation_request(req: ResponsesRequest, model: ServedModel) -> GenerationRequest:
    tool_choice, named = req.tool_choice_mode()
    params = sampling_params(
        model, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        repetition_penalty=req.repetition_penalty, seed=req.seed, max_tokens=req.max_output_tokens,
        logprobs=req.logprobs(),
    )
    effort = req.reasoning.effort if req.reasoning else None
    # The effort reaches templates that read it (gpt-oss's), as Chat Completions' does; so does verbosity.
    kwargs = {k: v for k, v in (("reasoning_effort", effort), ("verbosity", req.verbosity())) if v is not None}
    return GenerationRequest(
        prompt=ChatPrompt(req.chat_messages(), kwargs),
        params=params,
        thinking=thinking_from(None, effort),
        tools=req.chat_tools(),
        tool_choice=tool_choice,
        named_tool=named,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        prompt_param="input",
        field_names={"max_tokens": "max_output_tokens"},
        output_format=responses_text_format(req.text),
        strict_default=True,
    )


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


class ResponseShell:
    """The response object around the output: what the request asked for, echoed."""

    def __init__(self, req: ResponsesRequest, model_name: str) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.req = req
        self.model = req.model or model_name

    def body(self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        tool_choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None, "prompt_cache_key": req.prompt_cache_key,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": req.summary_mode()},
            "store": bool(req.store), "temperature": req.temperature, "text": req.text or {"format": {"type": "text"}},
            "tool_choice": tool_choice, "tools": req.function_tools(), "top_p": req.top_p, "truncation": "disabled",
            "top_logprobs": req.top_logprobs, "max_tool_calls": req.max_tool_calls,
            "usage": usage_body(usage) if usage is not None else None, "metadata": req.metadata or {},
        }


class OutputBuilder:
    """Events → output items + stream frames (without sequence numbers; `_Sequencer` adds them).
    `tokens` and `top_logprobs`: the message text carries logprobs; `sealed`: reasoning items
    carry `encrypted_content`; `summary`: they carry their text as a summary too (`_summary_*`)."""

    def __init__(self, tokens: TokenTexts | None = None, top_logprobs: int | None = None,
                 sealed: bool = False, summary: bool = False) -> None:
        self.items: list[dict[str, Any]] = []  # done items, in output order
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._tokens = tokens if top_logprobs is not None else None
        self._top = top_logprobs or 0
        self._sealed = sealed
        self._summary = summary
        self._pending: list[TokenLogprob] = []  # logprobs of tokens whose text has not come yet

    @property
    def _index(self) -> int:
        return len(self.items)

    def feed(self, event: Event) -> list[Frame]:
        if isinstance(event, TokensDelta):
            if self._tokens is not None and event.logprobs is not None:
                self._pending.extend(event.logprobs)
            return []
        if isinstance(event, ReasoningDelta):
            self._pending.clear()
            return self._delta("reasoning", event.text)
        if isinstance(event, TextDelta):
            return self._delta("message", event.text)
        if isinstance(event, ToolCallStart):
            self._pending.clear()
            frames = self.close()
            item = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "in_progress",
                    "call_id": event.id, "name": event.name, "arguments": ""}
            self._open = item
            return [*frames, {"type": "response.output_item.added", "output_index": self._index, "item": dict(item)}]
        if isinstance(event, ToolCallArgumentsDelta) and self._open is not None and self._open["type"] == "function_call":
            # NOTE: parsers finish one call's arguments before the next call starts.
            item = self._open
            item["arguments"] += event.arguments
            return [{"type": "response.function_call_arguments.delta", "item_id": item["id"],
                     "output_index": self._index, "delta": event.arguments}]
        if isinstance(event, ChoiceDone):
            self.finish_reason = event.finish_reason
            return self.close()
        if isinstance(event, Done):
            self.usage = event.usage
        return []

    def _delta(self, kind: str, text: str) -> list[Frame]:
        frames: list[Frame] = []
        if self._open is None or self._open["type"] != kind:
            frames = [*self.close(), *self._open_item(kind)]
        item = self._open
        assert item is not None
        item["text"] += text
        event = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        frame: Frame = {"type": event, "item_id": item["id"], "output_index": self._index,
                        "content_index": 0, "delta": text}
        if kind == "message":
            frame["logprobs"] = self._take_logprobs()
            item["logprobs"] += frame["logprobs"]
        elif self._summary:
            return [*frames, frame, {"type": "response.reasoning_summary_text.delta", **self._summary_ids(item),
                                     "delta": text}]
        return [*frames, frame]

    def _take_logprobs(self) -> list[dict[str, Any]]:
        tokens, pending, self._pending = self._tokens, self._pending, []
        return [tokens.chat_entry(lp, self._top) for lp in pending] if tokens is not None else []

    def _open_item(self, kind: str) -> list[Frame]:
        if kind == "message":
            item = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        else:
            item = {"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        self._open = {**item, "text": "", "logprobs": []}
        frames: list[Frame] = [
            {"type": "response.output_item.added", "output_index": self._index, "item": item},
            {"type": "response.content_part.added", "item_id": item["id"], "output_index": self._index,
             "content_index": 0, "part": part},
        ]
        if kind == "reasoning" and self._summary:
            frames.append({"type": "response.reasoning_summary_part.added", **self._summary_ids(item),
                           "part": {"type": "summary_text", "text": ""}})
        return frames

    # NOTE: this model has no summariser: a reasoning item's one summary part (index 0) is its
    # whole text, streamed alongside `reasoning_text` so that clients which show only
    # summaries (Codex, OpenAI's own API) show the thinking. Its events come last before
    # the item's `output_item.done`, as OpenAI orders them.

    def _summary_ids(self, item: dict[str, Any]) -> Frame:
        return {"item_id": item["id"], "output_index": self._index, "summary_index": 0}

    def _summary_done(self, item: dict[str, Any], text: str) -> list[Frame]:
        ids = self._summary_ids(item)
        part_done: Frame = {"type": "response.reasoning_summary_part.done", **ids,
                            "part": {"type": "summary_text", "text": text}}
        if self.status == "incomplete":  # the SDK's mark of a part the output limit cut
            part_done["status"] = "incomplete"
        return [{"type": "response.reasoning_summary_text.done", **ids, "text": text}, part_done]

    def close(self) -> list[Frame]:
        """Finish the open item: its closing events, then it joins `items`. The item still
        open when a length limit ended the output is `incomplete`, as OpenAI marks it (the
        output ends only once, so only the item open then can be cut)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index, frames = self._index, []
        if item["type"] == "function_call":
            item["status"] = self.status
            frames.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "arguments": item["arguments"]})
            done = dict(item)
        else:
            done, frames = self._close_text(item, index)
        self.items.append(done)
        return [*frames, {"type": "response.output_item.done", "output_index": index, "item": done}]

    def _close_text(self, item: dict[str, Any], index: int) -> tuple[dict[str, Any], list[Frame]]:
        text, logprobs = item.pop("text"), item.pop("logprobs")
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            return self._close_reasoning(item, text, ids)
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if self._tokens is not None:
            part["logprobs"] = logprobs
        frames = [{"type": "response.output_text.done", **ids, "text": text, "logprobs": logprobs},
                  {"type": "response.content_part.done", **ids, "part": part}]
        return {**item, "status": self.status, "content": [part]}, frames

    def _close_reasoning(self, item: dict[str, Any], text: str, ids: Frame) -> tuple[dict[str, Any], list[Frame]]:
        part = {"type": "reasoning_text", "text": text}
        frames = [{"type": "response.reasoning_text.done", **ids, "text": text},
                  {"type": "response.content_part.done", **ids, "part": part}]
        done = {**item, "status": self.status, "content": [part]}
        if self._summary:
            frames += self._summary_done(item, text)
            done["summary"] = [{"type": "summary_text", "text": text}]
        if self._sealed:
            done["encrypted_content"] = seal(text)
        return done, frames

    @property
    def status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"


# --------------------------------------------------------------------------- the route


async def create_response(state: ServerState, req: ResponsesRequest, request: Request) -> Response:
    model = state.serving(req.model)
    gen_req = await anyio.to_thread.run_sync(to_generation_request, req, model)  # many messages: a while
    shell = ResponseShell(req, model.name)
    beat = state.config.stream_heartbeat
    try:
        gen = await start_generation(state.client, model, gen_req, default_thinking=state.config.thinking_default,
                                     first_output_wait=beat if req.stream else None)
    except APIError as err:
        if req.stream and err.code == "context_length_exceeded":
            return sse_response(_failed_stream(shell, err))
        raise
    if req.stream:
        frames = _stream(gen, shell, _builder(req, model))
        return sse_response(with_heartbeat(frames, COMMENT_PING, beat, ping_first=gen.pending))
    builder = await unless_disconnected(request, _collect(gen, _builder(req, model)))
    assert builder.usage is not None
    return JSONResponse(shell.body(builder.status, builder.items, builder.usage))


def _builder(req: ResponsesRequest, model: ServedModel) -> OutputBuilder:
    return OutputBuilder(model.tokens, req.logprobs(), req.seals_reasoning(), req.summary_mode() is not None)


async def _collect(gen: Generation, builder: OutputBuilder) -> OutputBuilder:
    async for event in gen.events():
        builder.feed(event)
    return builder


class _Sequencer:
    """Numbers and frames stream events; `sequence_number` is contiguous from 0."""

    def __init__(self) -> None:
        self.next = 0

    def frame(self, event: Frame) -> bytes:
        body = {**event, "sequence_number": self.next}
        self.next += 1
        return event_frame(event["type"], body)


def _lifecycle(shell: ResponseShell, seq: _Sequencer) -> list[bytes]:
    snapshot = shell.body("in_progress", [])
    return [seq.frame({"type": "response.created", "response": snapshot}),
            seq.frame({"type": "response.in_progress", "response": snapshot})]


def _error_body(err: APIError) -> dict[str, Any]:
    """`response.failed`'s error: Codex acts on `context_length_exceeded` (it compacts);
    other failures get the nearest code of the SDK's list."""
    if err.code == "context_length_exceeded":
        code = err.code
    elif err.status == 429:
        code = "rate_limit_exceeded"
    else:
        code = "server_error" if err.status >= 500 else "invalid_prompt"
    return {"code": code, "message": err.message}


async def _failed_stream(shell: ResponseShell, err: APIError) -> AsyncIterator[bytes]:
    seq = _Sequencer()
    for frame in _lifecycle(shell, seq):
        yield frame
    yield seq.frame({"type": "response.failed", "response": shell.body("failed", [], error=_error_body(err))})


async def _stream(gen: Generation, shell: ResponseShell, builder: OutputBuilder) -> AsyncIterator[bytes]:
    seq = _Sequencer()
    try:
        for frame in _lifecycle(shell, seq):
            yield frame
        async for event in gen.events():
            for item in builder.feed(event):
                yield seq.frame(item)
        end = "response.incomplete" if builder.status == "incomplete" else "response.completed"
        yield seq.frame({"type": end, "response": shell.body(builder.status, builder.items, builder.usage)})
    except APIError as err:  # the engine failed midway: the stream says so, then ends
        body = shell.body("failed", builder.items, error=_error_body(err))
        yield seq.frame({"type": "response.failed", "response": body})
    finally:
        gen.close()
