"""`/v1/tokenize` and `/v1/detokenize`: the server's own tokenizer and chat template, no engine."""

from __future__ import annotations

from typing import Any

import anyio

from edgemoe.messages import SamplingParams
from edgemoe.server.errors import bad_request
from edgemoe.server.generation import ChatPrompt, GenerationRequest, render_prompt, thinking_from
from edgemoe.server.model import ServedModel
from edgemoe.server.protocol import DetokenizeRequest, TokenizeRequest


def _tokenize(model: ServedModel, req: TokenizeRequest, default_thinking: bool) -> list[int]:
    if req.prompt is not None:
        add_special = req.add_special_tokens is not False
        return model.tokenizer.encode(req.prompt, add_special_tokens=add_special)
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
        return model.tokenizer.encode(rendered.text, add_special_tokens=True)
    return rendered.token_ids


async def tokenize(model: ServedModel, req: TokenizeRequest, default_thinking: bool) -> dict[str, Any]:
    tokens = await anyio.to_thread.run_sync(_tokenize, model, req, default_thinking)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": model.max_model_len}


def detokenize(model: ServedModel, req: DetokenizeRequest) -> dict[str, Any]:
    # The tokenizer's own size: ids past it (padding rows of the embedding) have no text.
    size = model.tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < size]
    if bad:
        raise bad_request(f"token ids {bad[:5]} outside the tokenizer's vocabulary [0, {size})", param="tokens")
    return {"prompt": model.tokenizer.decode(req.tokens)}
