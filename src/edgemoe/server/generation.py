"""The generation core every API shares: a neutral request in, a typed event stream out.

`start_generation` renders the prompt (chat template or raw), checks it, sends `n`
engine requests and waits for the first engine answer, so a refused request is an
`APIError` before any response byte is sent. `Generation.events()` then yields the
`edgemoe.server.events` stream: each engine increment's text goes through that
choice's `ResponseParser` (reasoning split, then tool calls), whose deltas become
events. Engine failures surface as `APIError`s (503 engine gone, 400 refused, 500).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anyio
import msgspec

from edgemoe.messages import SEED_MIN, AddRequest, RequestOutput, SamplingParams
from edgemoe.server.call_format import XML_FORMATS, call_format, named_call_format
from edgemoe.server.choice import ChoiceState, make_parser
from edgemoe.server.engine_client import (
    EngineClient,
    EngineFailure,
    EngineRejected,
    EngineUnavailable,
    OutputStream,
)
from edgemoe.server.errors import APIError, ContextLengthExceeded, bad_request, unavailable
from edgemoe.server.events import ChoiceResult, Done, Event, Usage, fold_event
from edgemoe.server.forced_call import check_tool_choice, forced_opening
from edgemoe.server.generation_request import (
    ChatPrompt,
    GenerationRequest,
    RenderedPrompt,
    TextPrompt,
    TokensPrompt,
)
from edgemoe.server.limits import describe_ids
from edgemoe.server.model import ServedModel
from edgemoe.server.output_format import OutputFormat, forced_arguments, with_output_format
from edgemoe.server.parsers import (
    KEEPS_SPECIAL_TOKENS,
    WHOLE_OUTPUT_FORMATS,
    close_open_reasoning,
    prompt_opens_reasoning,
)
from edgemoe.server.prompt_tokens import TooManyTokens
from edgemoe.server.templates import RESERVED_VARIABLES, ChatInputError

log = logging.getLogger(__name__)


def thinking_from(enable_thinking: object, effort: str | None) -> bool | None:
    """A request's thinking switch: `enable_thinking` wins, then the effort; None = default.

    Efforts "none" and "minimal" turn thinking off, every other effort turns it on.
    """
    if isinstance(enable_thinking, bool):
        return enable_thinking
    if effort is not None:
        return effort.lower() not in ("none", "minimal")
    return None


def sampling_params(model: ServedModel, **values: Any) -> SamplingParams:
    """SamplingParams from request values; None means the model's generation_config
    default (for the keys it sets), else SamplingParams' own default."""
    chosen = {k: v for k, v in values.items() if v is not None}
    for key, default in model.sampling_defaults.items():
        if values.get(key) is None and key in SamplingParams.__struct_fields__:
            chosen[key] = default
    if "max_tokens" in values and values["max_tokens"] is None:
        chosen["max_tokens"] = None  # None is meaningful: until the context is full
    try:
        return SamplingParams(**chosen)
    except (TypeError, msgspec.ValidationError) as exc:
        raise bad_request(str(exc)) from exc


# --------------------------------------------------------------------------- prompt


def active_tools(req: GenerationRequest) -> list[dict[str, Any]] | None:
    if not req.tools or req.tool_choice == "none":
        return None
    return req.tools


def render_text(model: ServedModel, req: GenerationRequest, thinking: bool, forced: str) -> str:
    """The prompt text of a chat or text prompt (blocking: the chat template runs here);
    `forced`: the tool-call opening it ends with (`forced_opening`)."""
    prompt = req.prompt
    if isinstance(prompt, TextPrompt):
        return prompt.text
    assert isinstance(prompt, ChatPrompt)
    if model.template is None:
        why = model.template_error or "the model ships no chat template"
        raise bad_request(f"chat is not available: {why}", param="messages")
    kwargs = {k: v for k, v in prompt.template_kwargs.items() if k not in RESERVED_VARIABLES}
    messages = prompt.messages
    if not messages:  # else the template's own error: "list object has no element 0"
        raise bad_request("the conversation is empty: send a user message (an assistant prefill, reasoning or "
                          "skipped tool items alone leave the model nothing to answer)", param=req.prompt_param)
    try:
        if model.tool_parser == "harmony":
            from edgemoe.server.parsers import harmony  # parsers load when chosen (parsers/__init__.py)

            messages, kwargs = harmony.template_inputs(messages, kwargs, thinking)
        text = model.template.render(
            messages,
            tools=active_tools(req),
            add_generation_prompt=prompt.add_generation_prompt,
            enable_thinking=thinking and not forced,  # a forced call opens the turn: no thinking first
            **kwargs,
        )
    except ChatInputError as exc:
        raise bad_request(str(exc), param=req.prompt_param) from exc
    if forced:  # the call follows a closed think block, even where the template ignores enable_thinking
        text += close_open_reasoning(text)
    return text + prompt.continuation + forced


def render_prompt(model: ServedModel, req: GenerationRequest, thinking: bool) -> RenderedPrompt:
    """Token ids of the prompt (blocking: templates and tokenisers run here).

    Tokenising stops once the prompt cannot fit the context (a 400 naming both numbers),
    so an oversized prompt costs about a context's worth of work, not its whole size.
    """
    prompt = req.prompt
    if isinstance(prompt, TokensPrompt):
        return RenderedPrompt(list(prompt.token_ids), None, False)
    forced = forced_opening(model, req)
    text = render_text(model, req, thinking, forced)
    # A raw prompt gets the tokenizer's BOS; the template writes any BOS itself
    # (transformers' apply_chat_template does the same).
    raw = isinstance(prompt, TextPrompt)
    try:
        ids = model.prompt_tokens.encode(text, limit=model.max_model_len - 1, add_special_tokens=raw)
    except TooManyTokens as exc:
        raise context_exceeded(model, req, exc.count, exact=exc.exact) from exc
    if raw:
        return RenderedPrompt(ids, text, False)
    return RenderedPrompt(ids, text, prompt_opens_reasoning(text), forced)


def count_prompt_tokens(model: ServedModel, req: GenerationRequest, thinking: bool) -> int:
    """How many tokens the prompt has, however many (blocking; memory of one piece)."""
    if isinstance(req.prompt, TokensPrompt):
        return len(req.prompt.token_ids)
    check_tool_choice(req)  # as the request itself would be refused
    return model.prompt_tokens.count(render_text(model, req, thinking, forced_opening(model, req)))


def context_exceeded(model: ServedModel, req: GenerationRequest, n_tokens: int, *, exact: bool = True) -> APIError:
    return ContextLengthExceeded(
        f"the prompt has {'' if exact else 'at least '}{n_tokens} tokens, the context length is {model.max_model_len}",
        tokens=n_tokens, max_prompt_tokens=model.max_model_len - 1, exact=exact, param=req.prompt_param,
    )


def prepare_prompt(model: ServedModel, req: GenerationRequest, thinking: bool) -> RenderedPrompt:
    """Render and check the prompt: everything before the engine (blocking, for a worker)."""
    prompt = render_prompt(model, req, thinking)
    check_request(model, req, prompt)
    return prompt


def check_request(model: ServedModel, req: GenerationRequest, prompt: RenderedPrompt) -> None:
    """Everything the server can refuse before the engine sees the request."""
    n_tokens = len(prompt.token_ids)
    if n_tokens == 0:
        raise bad_request("the prompt is empty", param=req.prompt_param)
    if n_tokens >= model.max_model_len:
        raise context_exceeded(model, req, n_tokens)
    bad = [t for t in prompt.token_ids if not 0 <= t < model.vocab_size]
    if bad:
        raise bad_request(f"token ids {describe_ids(bad)} are outside the vocabulary [0, {model.vocab_size})",
                          param=req.prompt_param)
    try:
        req.params.validate(model.vocab_size)
    except ValueError as exc:
        name, _, why = str(exc).partition(" ")
        name = req.field_names.get(name, name)
        raise bad_request(f"{name} {why}", param=name) from exc
    check_tool_choice(req)


# --------------------------------------------------------------------------- running


def engine_error(exc: Exception) -> APIError:
    if isinstance(exc, EngineUnavailable):
        return unavailable(str(exc))
    if isinstance(exc, EngineRejected):
        return bad_request(str(exc), code="context_length_exceeded" if "context length" in str(exc) else None)
    return APIError(500, f"the engine failed this request: {exc}")


def step_failure(out: RequestOutput) -> APIError:
    """A request the engine ended with finish_reason "error" (a device out-of-memory in its
    step): the engine serves on, so it is 503, retry later, not a server bug."""
    return APIError(503, f"generation failed: {out.error or 'the engine failed this request'}",
                    code="generation_failed")


class Generation:
    """One running generation: `n` engine requests, one parser each."""

    def __init__(
        self, request_id: str, prompt: RenderedPrompt, stream: OutputStream,
        choices: list[ChoiceState], first: RequestOutput | None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self._stream = stream
        self._choices = choices
        self._by_id = {rid: c for rid, c in zip(stream.request_ids, choices, strict=True)}
        self._first: RequestOutput | None = first
        # None: started before its first output (a long prefill, see `start_generation`).
        self.pending = first is None

    async def wait_first(self) -> None:
        """Wait for the first output if it has not come yet (raises APIError if refused)."""
        if self.pending:
            self._first = await self._next()
            self.pending = False
            if self._first.finish_reason == "error":
                raise step_failure(self._first)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt.token_ids)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served; known from the first engine output on,
        so a stream can report it before any event (Anthropic's `message_start`)."""
        first = self._first.num_cached_tokens if self._first is not None else 0
        return max(first, self._choices[0].cached_tokens)

    async def events(self) -> AsyncIterator[Event]:
        """The event stream; raises APIError if the engine fails midway. Closes itself."""
        try:
            await self.wait_first()
            while not all(c.done for c in self._choices):
                out = self._first or await self._next()
                self._first = None
                if out.finish_reason == "error":
                    raise step_failure(out)
                for event in self._on_output(out):
                    yield event
            yield Done(self._usage())
        finally:
            self.close()

    def _on_output(self, out: RequestOutput) -> list[Event]:
        try:
            return self._by_id[out.request_id].on_output(out)
        except Exception as exc:
            # A bug on one output (a parser, say) must end this response in its protocol's
            # error shape, mid-stream too, not drop the connection.
            log.exception("processing an engine output failed")
            raise APIError(500, "the server failed this request (an internal error; the server log has "
                                "the details)") from exc

    async def collect(self) -> tuple[list[ChoiceResult], Usage]:
        """Run to the end: every choice folded, and the usage (the non-streamed view)."""
        choices: dict[int, ChoiceResult] = {}
        usage = Usage(self.prompt_tokens, 0)
        async for event in self.events():
            if isinstance(event, Done):
                usage = event.usage
            fold_event(choices, event)
        return [choices[i] for i in sorted(choices)], usage

    async def _next(self) -> RequestOutput:
        try:
            return await self._stream.get()
        except (EngineUnavailable, EngineRejected, EngineFailure) as exc:
            raise engine_error(exc) from exc

    def close(self) -> None:
        """Abort whatever is still generating (a client went away). Idempotent."""
        self._stream.abort()

    def _usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=sum(c.completion_tokens for c in self._choices),
            cached_tokens=self._choices[0].cached_tokens,
            reasoning_tokens=sum(c.reasoning_tokens for c in self._choices),
        )


def _output_constraint(model: ServedModel, req: GenerationRequest, forced: str) -> OutputFormat | None:
    """What the output is held to: a forced call's turn is the call (thinking off), its
    arguments (named) or calls (required), not the response format; else the response
    format (or, with tools, the format or tool calls: structured/value_or_calls.py), or the
    calls when a tool is strict (server/call_format.py). Harmony: a response format holds
    the final channel the prompt opened (`forced`), and nothing beside active tools (the
    channel's header, special tokens, is not for a byte-level grammar to write). Calls are
    held only where the format's call tags are single tokens (`writes_call_tags`)."""
    call_forced = bool(forced) and (req.tool_choice == "required" or req.named_tool is not None)
    if call_forced and req.named_tool is not None:
        if model.tool_parser in XML_FORMATS:  # the XML call is held whole, from inside its block
            held = model.tool_parser if model.writes_call_tags else None
            return named_call_format(held, req.tools, req.named_tool, forced)
        return forced_arguments(model.tool_parser, req.named_tool, req.tools)
    if model.tool_parser in WHOLE_OUTPUT_FORMATS and req.output_format is not None and not forced:
        return None
    tools_active = req.parse_output and req.tool_choice != "none"
    tool_format = model.tool_parser if model.teaches_calls and model.writes_call_tags and tools_active else None
    if req.output_format is not None and not call_forced:
        calls = call_format(tool_format, req.tools, "", one_call=not req.parallel_tool_calls, always=True,
                            strict_default=req.strict_default)
        return req.output_format if calls is None else replace(req.output_format, calls=calls.schema,
                                                               one_call=calls.one_call, tool_format=calls.tool_format)
    return call_format(tool_format, req.tools, forced, one_call=not req.parallel_tool_calls,
                       strict_default=req.strict_default)


async def start_generation(
    client: EngineClient, model: ServedModel, req: GenerationRequest, *,
    default_thinking: bool, request_id: str | None = None, first_output_wait: float | None = None,
) -> Generation:
    """Render, check and submit `req`; returns once the engine accepted it (first output),
    or, given `first_output_wait`, after that many seconds without it (`Generation.pending`:
    a stream starts and sends heartbeats while the prompt prefills)."""
    request_id = request_id or uuid.uuid4().hex
    thinking = req.thinking if req.thinking is not None else default_thinking
    prompt = await anyio.to_thread.run_sync(prepare_prompt, model, req, thinking)
    reasoning = req.parse_output and thinking and model.reasoning and isinstance(req.prompt, ChatPrompt)
    fmt = (await anyio.to_thread.run_sync(_output_constraint, model, req, prompt.forced) if req.tools  # compiles
           else _output_constraint(model, req, prompt.forced))
    params = with_output_format(req.params, fmt, thinks=reasoning and not prompt.forced,
                                starts_in_reasoning=prompt.starts_in_reasoning)
    if req.parse_output and model.tool_parser in KEEPS_SPECIAL_TOKENS:
        # Its markers are (or may be) special tokens, which a detokenizer skipping them would drop.
        params = msgspec.structs.replace(params, skip_special_tokens=False)
    adds = [
        AddRequest(request_id=f"{request_id}-{i}", prompt_ids=prompt.token_ids, params=_seeded(params, i))
        for i in range(req.n)
    ]
    try:
        stream = client.submit(adds)
    except EngineUnavailable as exc:
        raise unavailable(str(exc)) from exc
    except EngineRejected as exc:
        raise bad_request(str(exc), param=req.prompt_param) from exc
    try:
        first = await _first_output(stream, first_output_wait)
    except (EngineUnavailable, EngineRejected, EngineFailure) as exc:
        stream.abort()
        raise engine_error(exc) from exc
    except BaseException:
        stream.abort()
        raise
    if first is not None and first.finish_reason == "error":  # failed before any response byte: a plain 503
        stream.abort()
        raise step_failure(first)
    choices = [
        ChoiceState(
            i,
            make_parser(model, active_tools(req) if req.parse_output else None, reasoning=reasoning,
                        starts_in_reasoning=prompt.starts_in_reasoning, forced=prompt.forced,
                        parse=req.parse_output),
            parallel_tool_calls=req.parallel_tool_calls,
        )
        for i in range(req.n)
    ]
    return Generation(request_id, prompt, stream, choices, first)


async def _first_output(stream: OutputStream, wait: float | None) -> RequestOutput | None:
    """The stream's first output; None if `wait` seconds pass first (it stays queued)."""
    if wait is None:
        return await stream.get()
    getter = asyncio.ensure_future(stream.get())
    try:
        await asyncio.wait({getter}, timeout=wait)
    finally:
        # NOTE: a Queue.get cancelled before it returned leaves its item queued for
        # `Generation`; one that already returned (cancel() is False) is used here.
        cancelled = getter.cancel()
    return None if cancelled else getter.result()


def _seeded(params: SamplingParams, i: int) -> SamplingParams:
    # n > 1 with a seed: each choice gets its own stream, reproducible as a whole.
    if i == 0 or params.seed is None:
        return params
    # Wraps within 64 signed bits, so every choice's seed stays a valid one.
    seed = (params.seed + i - SEED_MIN) % 2**64 + SEED_MIN
    return msgspec.structs.replace(params, seed=seed)
