"""`edgemoe.LLM`: the engine in-process, for scripts, tests, `edgemoe generate` and benchmarks."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from edgemoe.config import EngineConfig
from edgemoe.engine.engine import Engine
from edgemoe.messages import RequestOutput, SamplingParams, TokenLogprob

Prompt = str | list[int]
Message = Mapping[str, Any]  # {"role": ..., "content": ...}, as in Chat Completions


@dataclass
class CompletionOutput:
    """One prompt's result. `token_ids` are the generated ids only."""

    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache

    def add(self, out: RequestOutput) -> None:
        self.text += out.text
        self.num_cached_tokens = out.num_cached_tokens
        self.token_ids.extend(out.token_ids)
        if out.logprobs:
            self.logprobs = (self.logprobs or []) + out.logprobs
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason


@dataclass(frozen=True)
class StreamDelta:
    """An increment of one streamed completion; texts concatenate to the final text."""

    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None


class LLM:
    """`LLM(model=None, **settings)`: every CLI flag `--foo-bar` is the keyword `foo_bar`.

    `model=None` loads the demo model (random weights); `model="random:qwen3-30b-a3b"`
    random weights at a real model's shape (docs/models.md). Use as a context manager, or call
    `close()`, to free the model before building another one in the same process.
    """

    def __init__(self, model: str | None = None, *, progress: bool = False, **settings: Any) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **settings)
        self.engine: Engine | None = Engine(self.config, progress=progress)
        self._ids = itertools.count()

    @property
    def tokenizer(self):  # noqa: ANN201 - TokenizerBundle
        return self._engine().tokenizer

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("this LLM is closed")
        return self.engine

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self._engine().tokenizer.encode(prompt, add_special_tokens=True)
        return list(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """Run every prompt to completion as one continuously batched workload."""
        prompt_list = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompt_list))
        engine = self._engine()
        results: dict[str, CompletionOutput] = {}
        for prompt, p in zip(prompt_list, params, strict=True):
            ids = self.encode(prompt)
            rid = engine.add_request(ids, p, request_id=f"llm-{next(self._ids)}")
            results[rid] = CompletionOutput(prompt_token_ids=ids)
        pending = set(results)
        while pending:
            for out in engine.step():
                if out.request_id in results:
                    results[out.request_id].add(out)
                    if out.finished:
                        pending.discard(out.request_id)
        return list(results.values())

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[CompletionOutput]:
        """Like vLLM's `LLM.chat`: one conversation (a list of messages) or several, each
        rendered with the model's chat template, then generated as `generate` does. The
        output text is raw: a thinking model's `<think>` block is in it."""
        conversations = [messages] if not messages or isinstance(messages[0], Mapping) else messages
        prompts: list[Prompt] = [
            self.chat_prompt(c, tools=tools, enable_thinking=enable_thinking,  # type: ignore[arg-type]
                             add_generation_prompt=add_generation_prompt, chat_template_kwargs=chat_template_kwargs)
            for c in conversations
        ]
        return self.generate(prompts, sampling_params)

    def render_chat(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text the chat template makes of `messages` (what the server sends too)."""
        from edgemoe.server.templates import ChatTemplate

        template = ChatTemplate.from_tokenizer(self.tokenizer)
        if template is None:
            raise ValueError("the model has no chat template (chat_template.jinja or tokenizer_config.json)")
        return template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                               enable_thinking=enable_thinking, **dict(chat_template_kwargs or {}))

    def chat_prompt(self, messages: Sequence[Message], **kwargs: Any) -> list[int]:
        """Token ids of `render_chat(messages, **kwargs)`; the template writes any special tokens."""
        return self._engine().tokenizer.encode(self.render_chat(messages, **kwargs), add_special_tokens=False)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield increments of one completion as they are generated."""
        engine = self._engine()
        rid = engine.add_request(self.encode(prompt), sampling_params or SamplingParams(), f"llm-{next(self._ids)}")
        try:
            while True:
                for out in engine.step():
                    if out.request_id == rid:
                        yield StreamDelta(out.text, out.token_ids, out.finished, out.finish_reason)
                        if out.finished:
                            return
        finally:
            engine.abort(rid)  # a consumer that stops early frees the request

    def prompt_logits(self, prompt: Prompt) -> torch.Tensor:
        """Float32 logits [T, V] at every position of the prompt."""
        return self._engine().prompt_logits(self.encode(prompt))

    def stats(self) -> dict[str, Any]:
        """Expert-cache hits/misses (per layer), bytes copied, CPU experts, copy/CPU
        time, KV occupancy and the memory plan."""
        return self._engine().stats()

    def close(self) -> None:
        """Free the engine: its threads stop and its device memory goes back to the driver
        (`Engine.close`), so another `LLM` in this process can plan for it."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # type: ignore[arg-type]
    return list(prompts)  # type: ignore[arg-type]


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"{len(params)} sampling params for {n} prompts")
    return list(params)
