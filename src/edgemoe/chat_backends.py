"""Where `edgemoe chat` gets its answers: the engine in this process, or a running server.

Both turn a conversation into a stream of `Piece`s (reasoning or content text) and can
describe the engine (`/stats`). `stop()` ends the answer in flight: in-process the
request is aborted between engine steps (never inside one: the engine's state stays
whole); over HTTP the stream is closed and the server aborts the request.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import httpx

from edgemoe.messages import SamplingParams


class Piece(NamedTuple):
    kind: str  # "reasoning" | "content"
    text: str


@dataclass
class Answer:
    """What one turn produced, filled in while it streams."""

    reasoning: str = ""
    content: str = ""
    finish_reason: str | None = None
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    first: float | None = None

    def add(self, piece: Piece) -> None:
        if self.first is None:
            self.first = time.monotonic()
        if piece.kind == "reasoning":
            self.reasoning += piece.text
        else:
            self.content += piece.text

    def summary(self) -> str:
        parts = [self.finish_reason or "stopped", f"{self.tokens} tokens"]
        if self.first is not None:
            parts.append(f"first token {1000 * (self.first - self.started):.0f} ms")
            seconds = time.monotonic() - self.first
            if self.tokens > 1 and seconds > 0:
                parts.append(f"{(self.tokens - 1) / seconds:.1f} tok/s")
        return " · ".join(parts)


class ChatBackend(Protocol):
    name: str
    random_weights: bool

    def stream(self, messages: list[dict[str, Any]], answer: Answer) -> Iterator[Piece]: ...

    def stop(self) -> None: ...

    def stats(self) -> str: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None
    temperature: float | None
    thinking: bool | None  # None: the template's default


class LocalBackend:
    """The engine in this process (`edgemoe.LLM`). Its output is read as the server reads it:
    `<think>` reasoning, or a format that frames every message (harmony: gpt-oss's channels,
    whose markers are special tokens kept in the text for its parser)."""

    def __init__(self, llm: Any, sampling: Sampling) -> None:
        self.llm, self.sampling = llm, sampling
        source = llm.engine.runtime.source
        self.name, self.random_weights = source.name, source.random_weights
        template_source, model_type = _template_and_type(llm)
        self.whole_format = _whole_output_format(template_source, model_type)
        from edgemoe.server.parsers import strips_answer_tags

        self.answer_tags = strips_answer_tags(model_type, template_source)  # ERNIE's <response> … </response>
        self._stopped = False

    def stream(self, messages: list[dict[str, Any]], answer: Answer) -> Iterator[Piece]:
        self._stopped = False
        variables: dict[str, Any] = {}
        if self.whole_format == "harmony":
            from edgemoe.server.parsers import harmony

            messages, variables = harmony.template_inputs(messages, variables, self.sampling.thinking is not False)
        text = self.llm.render_chat(messages, enable_thinking=self.sampling.thinking, chat_template_kwargs=variables)
        prompt = self.llm.tokenizer.encode(text, add_special_tokens=False)
        params = SamplingParams(max_tokens=self.sampling.max_tokens, skip_special_tokens=self.whole_format is None)
        if self.sampling.temperature is not None:
            params.temperature = self.sampling.temperature
        parser = self._parser(text)
        deltas = self.llm.stream(prompt, params)
        try:
            for delta in deltas:
                answer.tokens += len(delta.token_ids)
                if delta.finished:
                    answer.finish_reason = delta.finish_reason
                yield from _split(parser, delta.text)
                if self._stopped:  # checked between steps: the engine is never interrupted mid-step
                    return
            if parser is not None:
                # a call the length limit cut drops its raw tail, as the server's does
                yield from _pieces(parser.finish(cut=answer.finish_reason == "length"))
        finally:
            deltas.close()  # aborts the request if it is still running

    def _parser(self, prompt: str) -> Any:
        from edgemoe.server.parsers import (
            AnswerTagResponseParser,
            ResponseParser,
            ThinkReasoningParser,
            get_tool_parser,
            prompt_opens_reasoning,
        )

        if self.whole_format is not None:
            return ResponseParser(None, get_tool_parser(self.whole_format)(None))
        thinking = None if self.sampling.thinking is False else ThinkReasoningParser(
            starts_in_reasoning=prompt_opens_reasoning(prompt))
        if self.answer_tags:
            return AnswerTagResponseParser(thinking)
        return ResponseParser(thinking, None) if thinking is not None else None

    def stop(self) -> None:
        self._stopped = True

    def stats(self) -> str:
        from edgemoe.ctl import format_engine_stats

        return format_engine_stats(self.llm.stats())

    def close(self) -> None:
        self.llm.close()


def _template_and_type(llm: Any) -> tuple[str, str]:
    """The model's chat template source ('' without one) and its model type, as the server
    reads them to choose its parsers."""
    from edgemoe.server.templates import ChatTemplate

    try:
        source = ChatTemplate.from_tokenizer(llm.tokenizer).source
    except ValueError:
        source = ""
    arch = getattr(llm.engine.runtime.model, "arch", None)
    return source, getattr(arch, "model_type", "")


def _whole_output_format(template_source: str, model_type: str) -> str | None:
    """The model's output format when it frames every message (`WHOLE_OUTPUT_FORMATS`),
    chosen as the server chooses (`pick_tool_format`), else None."""
    from edgemoe.server.parsers import WHOLE_OUTPUT_FORMATS, pick_tool_format

    chosen = pick_tool_format(None, template_source, model_type)
    return chosen if chosen in WHOLE_OUTPUT_FORMATS else None


def _split(parser: Any, text: str) -> Iterator[Piece]:
    if parser is None:
        if text:
            yield Piece("content", text)
        return
    yield from _pieces(parser.feed(text))


def _pieces(delta: Any) -> Iterator[Piece]:
    if delta.reasoning:
        yield Piece("reasoning", delta.reasoning)
    if delta.content:
        yield Piece("content", delta.content)


class RemoteBackend:
    """A running `edgemoe serve` (or any server speaking Chat Completions), over HTTP."""

    def __init__(self, url: str, api_key: str | None, sampling: Sampling) -> None:
        self.url, self.sampling = url.rstrip("/"), sampling
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(30.0, read=None))
        info = self._get("/debug/engine")
        self.name = info.get("served_model_name") or "default"
        self.random_weights = bool(info.get("random_weights"))
        self._response: httpx.Response | None = None

    def _get(self, path: str) -> dict[str, Any]:
        with _said(self.url):
            r = self.http.get(self.url + path)
            if r.status_code == 401:
                raise ValueError(f"{self.url} wants an API key: --api-key KEY or $EDGEMOE_API_KEY")
            r.raise_for_status()
            body: dict[str, Any] = r.json()
        return body

    def stream(self, messages: list[dict[str, Any]], answer: Answer) -> Iterator[Piece]:
        with _said(self.url):
            yield from self._stream(messages, answer)

    def _stream(self, messages: list[dict[str, Any]], answer: Answer) -> Iterator[Piece]:
        body: dict[str, Any] = {"model": self.name, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}, "max_tokens": self.sampling.max_tokens}
        if self.sampling.temperature is not None:
            body["temperature"] = self.sampling.temperature
        if self.sampling.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.sampling.thinking}
        with self.http.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise ValueError(f"the server answered {r.status_code}: {_error(r)}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                yield from self._chunk(json.loads(line[6:]), answer)

    def _chunk(self, chunk: dict[str, Any], answer: Answer) -> Iterator[Piece]:
        if "error" in chunk:
            raise ValueError(f"the server failed the answer: {chunk['error'].get('message')}")
        if chunk.get("usage"):
            answer.tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                yield Piece("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                yield Piece("content", delta["content"])
            if choice.get("finish_reason"):
                answer.finish_reason = choice["finish_reason"]

    def stop(self) -> None:
        """Nothing to do: Ctrl-C interrupts the read and leaving the `with` closes the stream."""

    def stats(self) -> str:
        from edgemoe.ctl import format_stats

        return format_stats(self._get("/v1/stats"))

    def close(self) -> None:
        self.http.close()


@contextlib.contextmanager
def _said(url: str) -> Iterator[None]:
    """The transport's failures (no server there, it went away mid-answer, a non-JSON
    body) as the one-line ValueError the chat prints, not a traceback."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {url}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{url} answered something that is not JSON ({exc})") from None


def _error(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200]
