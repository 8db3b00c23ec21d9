"""`/v1/tokenize` and `/v1/detokenize`: the server's own tokenizer and chat template, no engine.

Both are bounded by the context length (a text of more tokens, or more ids, is a 400
naming both numbers) and run in a worker thread, off the event loop: a 30 MB text
once took the server to 5 GB, and decoding 4 M ids held the loop 3.6 s.
"""

from __future__ import annotations

from typing import Any

import anyio

from edgemoe.messages import SamplingParams
from edgemoe.server.errors import bad_request
from edgemoe.server.generation import render_prompt, thinking_from
from edgemoe.server.generation_request import ChatPrompt, GenerationRequest
from edgemoe.server.limits import describe_ids
from edgemoe.server.model import ServedModel
from edgemoe.server.prompt_tokens import TooManyTokens
from edgemoe.server.protocol import DetokenizeRequest, TokenizeRequest


def _tokenize(model: ServedModel, req: TokenizeRequest, default_thinking: bool) -> list[int]:
    if req.prompt is not None:
        return _encode(model, req.prompt, add_special_tokens=req.add_special_tokens is not False, param="prompt")
    kwargs = dict(req.chat_template_kwargs or {})
    thinking = thinking_from(kwargs.get("enable_thinking"), None)
    tools = [t.model_dump(exclude_none=True) for t in req.tools or [] if t.type == "function"] or None
    gen = GenerationRequest(
        prompt=ChatPrompt([m.model_dump(exclude_none=True) for m in req.messages or []], kwargs,
                          add_generation_prompt=req.add_generation_prompt),
        params=SamplingParams(),
        tools=tools,
    )
    rendered = render_prompt(model, gen, default_thinking if thinking is None else thinking)
    if req.add_special_tokens and rendered.text is not None:
        return _encode(model, rendered.text, add_special_tokens=True, param="messages")
    return rendered.token_ids


def _encode(model: ServedModel, text: str, *, add_special_tokens: bool, param: str) -> list[int]:
    limit = model.max_model_len
    try:
        return model.prompt_tokens.encode(text, limit=limit, add_special_tokens=add_special_tokens)
    except TooManyTokens as exc:
        more = "" if exc.exact else "at least "
        raise bad_request(f"the text has {more}{exc.count} tokens; /v1/tokenize takes at most the context "
                          f"length, {limit}", param=param, code="context_length_exceeded") from exc


async def tokenize(model: ServedModel, req: TokenizeRequest, default_thinking: bool) -> dict[str, Any]:
    tokens = await anyio.to_thread.run_sync(_tokenize, model, req, default_thinking)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": model.max_model_len}


def _detokenize(model: ServedModel, req: DetokenizeRequest) -> dict[str, Any]:
    # The tokenizer's own size: ids past it (padding rows of the embedding) have no text.
    size = model.tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < size]
    if bad:
        raise bad_request(f"token ids {describe_ids(bad)} are outside the tokenizer's vocabulary [0, {size})", param="tokens")
    return {"prompt": model.tokenizer.decode(req.tokens)}


async def detokenize(model: ServedModel, req: DetokenizeRequest) -> dict[str, Any]:
    if len(req.tokens) > model.max_model_len:
        raise bad_request(f"tokens has {len(req.tokens)} ids; /v1/detokenize takes at most the context length, "
                          f"{model.max_model_len}", param="tokens")
    return await anyio.to_thread.run_sync(_detokenize, model, req)
