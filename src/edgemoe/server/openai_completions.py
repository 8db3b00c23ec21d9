"""Legacy Completions (`POST /v1/completions`): a raw prompt, text back, no parsing.

One prompt per request (a string, a token-id list, or a one-element list of either).
`echo` prepends the prompt text; prompt logprobs are not computed, so `echo` with
`logprobs` is refused.
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
from edgemoe.server.errors import APIError, bad_request
from edgemoe.server.events import ChoiceDone, Done, TextDelta, TokensDelta, Usage
from edgemoe.server.generation import (
    Generation,
    sampling_params,
    start_generation,
)
from edgemoe.server.generation_request import (
    GenerationRequest,
    Prompt,
    TextPrompt,
    TokensPrompt,
)
from edgemoe.server.heartbeat import COMMENT_PING, with_heartbeat
from edgemoe.server.model import ServedModel
from edgemoe.server.openai_chat import usage_body
from edgemoe.server.output_format import chat_response_format
from edgemoe.server.protocol import CompletionRequest
from edgemoe.server.sse import DONE, data_frame, error_frame, sse_response
from edgemoe.server.state import ServerState


def _prompt(raw: str | list[int] | list[str] | list[list[int]]) -> Prompt:
    if isinstance(raw, str):
        return TextPrompt(raw)
    if raw and all(isinstance(t, int) for t in raw):
        return TokensPrompt(list(raw))  # type: ignore[arg-type]
    if len(raw) != 1:
        raise bad_request("exactly one prompt per request is supported", param="prompt")
    return _prompt(raw[0])  # type: ignore[arg-type]


def to_generation_request(req: CompletionRequest, model: ServedModel) -> GenerationRequest:
    if req.echo and req.logprobs is not None:
        raise bad_request("echo with logprobs is not supported (no prompt logprobs)", param="echo")
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported (use n)", param="best_of")
    params = sampling_params(
        model,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, seed=req.seed, max_tokens=req.max_tokens,
        min_tokens=req.min_tokens, ignore_eos=req.ignore_eos, stop=req.stop_list(),
        stop_token_ids=req.stop_token_ids, skip_special_tokens=req.skip_special_tokens,
        logit_bias=req.logit_bias or None,  # {}: no bias, no cost
        logprobs=req.logprobs,
    )
    return GenerationRequest(
        prompt=_prompt(req.prompt), params=params, n=req.n, parse_output=False, prompt_param="prompt",
        output_format=chat_response_format(req.response_format),  # the text is the JSON, from its first token
    )


class _Body:
    """Shapes shared by the response and its chunks."""

    def __init__(self, model: ServedModel, name: str, top_logprobs: int | None) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.name = name
        self.model = model
        self.top_logprobs = top_logprobs

    def logprobs(self, entries: list[TokenLogprob] | None, offset: int) -> dict[str, Any] | None:
        if self.top_logprobs is None:
            return None
        return self.model.tokens.completion_logprobs(entries or [], self.top_logprobs, offset)

    def envelope(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.name,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage_body(usage)
        return body


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    model = state.serving(req.model)
    gen_req = await anyio.to_thread.run_sync(to_generation_request, req, model)  # a long prompt id list: a while
    beat = state.config.stream_heartbeat
    gen = await start_generation(state.client, model, gen_req, default_thinking=False,
                                 first_output_wait=beat if req.stream else None)
    body = _Body(model, req.model or model.name, gen_req.params.logprobs)
    echo = _echo_text(model, gen) if req.echo else ""
    if req.stream:
        frames = _stream(gen, body, echo, req.n, req.include_usage())
        return sse_response(with_heartbeat(frames, COMMENT_PING, beat, ping_first=gen.pending))
    choices, usage = await unless_disconnected(request, gen.collect())
    out = [
        {
            "index": c.index,
            "text": echo + c.text,
            "logprobs": body.logprobs(c.logprobs, len(echo)),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        for c in choices
    ]
    return JSONResponse(body.envelope(out, usage))


def _echo_text(model: ServedModel, gen: Generation) -> str:
    if gen.prompt.text is not None:
        return gen.prompt.text
    return model.tokenizer.decode(gen.prompt.token_ids)


async def _stream(gen: Generation, body: _Body, echo: str, n: int, include_usage: bool) -> AsyncIterator[bytes]:
    offsets = [len(echo)] * n
    pending: dict[int, list[TokenLogprob]] = {}

    def chunk(choice: int, text: str, finish_reason: str | None = None, **extra: Any) -> bytes:
        entries = pending.pop(choice, None)
        logprobs = body.logprobs(entries, offsets[choice]) if entries or finish_reason is None else None
        if logprobs is not None:
            # Offsets count the tokens' own text, as the non-streamed `text_offset` does:
            # the text sent so far can lag behind it (a possible stop string held back).
            offsets[choice] += sum(map(len, logprobs["tokens"]))
        entry = {"index": choice, "text": text, "logprobs": logprobs, "finish_reason": finish_reason, **extra}
        return data_frame(body.envelope([entry]))

    try:
        if echo:
            for choice in range(n):
                yield chunk(choice, echo)
        async for event in gen.events():
            if isinstance(event, TokensDelta) and event.logprobs is not None:
                pending.setdefault(event.choice, []).extend(event.logprobs)
            elif isinstance(event, TextDelta):
                yield chunk(event.choice, event.text)
            elif isinstance(event, ChoiceDone):
                yield chunk(event.choice, "", event.finish_reason, stop_reason=event.stop_reason)
            elif isinstance(event, Done) and include_usage:
                yield data_frame({**body.envelope([], event.usage)})
        yield DONE
    except APIError as err:
        yield error_frame(err)
    finally:
        gen.close()
