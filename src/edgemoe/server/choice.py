"""One choice of a generation: engine increments → parser → neutral events.

Each `RequestOutput` carries newly final text (stop strings already cut by the
engine); it is fed to the choice's `ResponseParser`, and the parsed delta becomes
`ReasoningDelta` / `TextDelta` / `ToolCallStart` / `ToolCallArgumentsDelta` events.
The last increment also flushes the parser, telling it whether a length limit cut the
output (`cut_by_length`), and ends the choice with `ChoiceDone`.
"""

from __future__ import annotations

from typing import Any

from edgemoe.messages import RequestOutput
from edgemoe.server.events import (
    ChoiceDone,
    Event,
    ReasoningDelta,
    TextDelta,
    TokensDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from edgemoe.server.forced_call import PrimedParser
from edgemoe.server.model import ServedModel
from edgemoe.server.parsers import (
    WHOLE_OUTPUT_FORMATS,
    AnswerTagResponseParser,
    ParsedDelta,
    ResponseParser,
    ThinkReasoningParser,
    ToolCallDelta,
    get_tool_parser,
    strips_answer_tags,
)


def make_parser(
    model: ServedModel,
    tools: list[dict[str, Any]] | None,
    *,
    reasoning: bool,
    starts_in_reasoning: bool,
    forced: str = "",
    parse: bool = True,
) -> ResponseParser | None:
    """The parser pipeline for one choice, or None when the text passes through as is
    (`parse` false: a raw prompt's output is never parsed).

    `forced`: the opening the prompt ends with (a tool call's), read as if generated. A
    format that frames all output (harmony) is parsed whole, with or without tools.
    """
    if not parse:
        return None
    if model.tool_parser in WHOLE_OUTPUT_FORMATS:
        whole = get_tool_parser(model.tool_parser)(tools)
        return PrimedParser(whole, forced) if forced else ResponseParser(None, whole)
    tool_parser = get_tool_parser(model.tool_parser)(tools) if tools and model.tool_parser else None
    if forced and tool_parser is not None:
        return PrimedParser(tool_parser, forced)
    reasoning_parser = ThinkReasoningParser(starts_in_reasoning=starts_in_reasoning) if reasoning else None
    # ERNIE-4.5 Thinking wraps its answer in <response> tags, thinking or not: unwrap the content.
    if strips_answer_tags(model.info.model_type, model.template.source if model.template else ""):
        return AnswerTagResponseParser(reasoning_parser, tool_parser)
    if reasoning_parser is None and tool_parser is None:
        return None
    return ResponseParser(reasoning_parser, tool_parser)


def cut_by_length(out: RequestOutput) -> bool:
    """Whether the output ended by a length limit (`max_tokens` or the context), not by the
    model (EOS, a stop string or id). The parser then closes a call it was reading with its
    completed arguments and drops the call's unfinished raw tail: the model did not break
    the format, and that markup shown or kept as content would mislead agents and users."""
    return out.finish_reason == "length"


class ChoiceState:
    """Parser state and counters of one choice. Not thread-safe (one event loop)."""

    def __init__(self, index: int, parser: ResponseParser | None, *, parallel_tool_calls: bool = True) -> None:
        self.index = index
        self.parser = parser
        self.parallel_tool_calls = parallel_tool_calls
        self.done = False
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.reasoning_tokens = 0
        self._unattributed = 0  # tokens whose text the parser still holds back
        self._calls = 0
        # A forced call's start that the prompt already wrote: it precedes every generated piece.
        self._opening = parser.opening if isinstance(parser, PrimedParser) else None

    def on_output(self, out: RequestOutput) -> list[Event]:
        if self.done:
            return []
        events: list[Event] = []
        if self._opening is not None:
            events, self._opening = self._delta_events(self._opening), None
        if out.token_ids:
            self.completion_tokens += len(out.token_ids)
            events.append(TokensDelta(self.index, list(out.token_ids), out.logprobs))
        self.cached_tokens = max(self.cached_tokens, out.num_cached_tokens)
        delta = self._parse(out)
        self._count_reasoning(len(out.token_ids), delta)
        events.extend(self._delta_events(delta))
        if out.finished:
            self.done = True
            events.append(self._done(out))
        return events

    def _parse(self, out: RequestOutput) -> ParsedDelta:
        if self.parser is None:
            return ParsedDelta(content=out.text)
        delta = self.parser.feed(out.text) if out.text else ParsedDelta()
        if out.finished:
            tail = self.parser.finish(cut=cut_by_length(out))
            delta = ParsedDelta(
                delta.content + tail.content, delta.reasoning + tail.reasoning, delta.tool_calls + tail.tool_calls
            )
        return delta

    def _count_reasoning(self, n_tokens: int, delta: ParsedDelta) -> None:
        # Text held back by the parser is attributed to whatever it turns out to be.
        self._unattributed += n_tokens
        if delta.content or delta.tool_calls:
            self._unattributed = 0
        elif delta.reasoning:
            self.reasoning_tokens += self._unattributed
            self._unattributed = 0

    def _delta_events(self, delta: ParsedDelta) -> list[Event]:
        # A ParsedDelta does not keep the order of its parts. Reasoning always comes
        # first, and the rest of a call already under way (e.g. its closing "}" when the
        # output ends) precedes the content: it was generated before that text, and
        # block-based protocols (Anthropic, Responses) close a call once text arrives, so
        # pieces after it would be lost. Calls starting here follow the content.
        events: list[Event] = []
        if delta.reasoning:
            events.append(ReasoningDelta(self.index, delta.reasoning))
        started = {p.index for p in delta.tool_calls if p.name is not None}
        events.extend(self._call_events([p for p in delta.tool_calls if p.index not in started]))
        if delta.content:
            events.append(TextDelta(self.index, delta.content))
        events.extend(self._call_events([p for p in delta.tool_calls if p.index in started]))
        return events

    def _call_events(self, pieces: list[ToolCallDelta]) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if piece.index > 0 and not self.parallel_tool_calls:
                continue  # parallel_tool_calls=false: only the first call is returned
            if piece.name is not None:
                self._calls += 1
                events.append(ToolCallStart(self.index, piece.index, piece.id or "", piece.name))
            if piece.arguments:
                events.append(ToolCallArgumentsDelta(self.index, piece.index, piece.arguments))
        return events

    def _done(self, out: RequestOutput) -> ChoiceDone:
        reason = out.finish_reason or "stop"
        # A cut-off output says "length" even after calls: its last call or text may be
        # truncated, and clients must not take it for a finished turn (OpenAI and
        # Anthropic do the same: length / max_tokens win over tool_calls / tool_use).
        if self._calls and reason != "length":
            reason = "tool_calls"
        elif reason not in ("stop", "length"):
            reason = "stop"  # "abort" only reaches us if the engine dropped the request itself
        return ChoiceDone(self.index, reason, out.stop_reason, self.completion_tokens, self.reasoning_tokens)
