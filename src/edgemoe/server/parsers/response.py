"""The combined pipeline: a reasoning parser, then a tool parser on the content it lets
through (the parsers' contracts and outputs: `base.py`)."""

from __future__ import annotations

from edgemoe.server.parsers.base import (
    ParsedDelta,
    ParsedMessage,
    ReasoningDelta,
    ReasoningParser,
    ToolParser,
    accumulate,
    merge_call_deltas,
)


class ResponseParser:
    """Reasoning parser, then tool parser on the content it lets through.

    Tool calls are only looked for in content: a ``<tool_call>`` inside reasoning is
    reasoning. Either stage may be ``None`` (no reasoning split / no tools); a tool
    parser that ``reads_whole_output`` runs alone and splits the reasoning itself.
    """

    def __init__(
        self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self._used = False
        self._finished = False

    @property
    def tool_calls_emitted(self) -> int:
        return self.tools.tool_calls_emitted if self.tools is not None else 0

    def feed(self, text: str) -> ParsedDelta:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._used = True
        if self.reasoning is None:
            return self._through_tools(ReasoningDelta("", text), finish=False)
        return self._through_tools(self.reasoning.feed(text), finish=False)

    def finish(self, cut: bool = False) -> ParsedDelta:
        """The rest, the output having ended; `cut`: by a length limit, not the model (only
        the tool stage cares: `ToolParser`)."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._used = self._finished = True
        split = self.reasoning.finish() if self.reasoning is not None else ReasoningDelta("", "")
        return self._through_tools(split, finish=True, cut=cut)

    def parse_complete(self, text: str, cut: bool = False) -> ParsedMessage:
        """Non-streamed parse on a fresh parser: exactly ``feed(text)`` + ``finish(cut)``."""
        if self._used:
            raise RuntimeError("parse_complete needs a fresh ResponseParser")
        return accumulate([self.feed(text), self.finish(cut)])

    def _through_tools(self, split: ReasoningDelta, finish: bool, cut: bool = False) -> ParsedDelta:
        if self.tools is None:
            return ParsedDelta(split.content, split.reasoning)
        out = self.tools.feed(split.content) if split.content else ParsedDelta()
        if finish:
            tail = self.tools.finish(cut)
            out = ParsedDelta(
                out.content + tail.content,
                out.reasoning + tail.reasoning,
                merge_call_deltas(out.tool_calls + tail.tool_calls),
            )
        # Reasoning from the tool stage: a format that reads the whole output (harmony).
        return ParsedDelta(out.content, split.reasoning + out.reasoning, out.tool_calls)
