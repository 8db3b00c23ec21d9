"""ERNIE-4.5 Thinking's answer tags: ``<response>`` … ``</response>`` around the content.

ERNIE-4.5-21B-A3B-Thinking ends its reasoning with ``</think>`` and then writes either
``\\n\\n<response>\\nANSWER\\n</response>\\n`` or plain ``ANSWER`` (tool calls, Hermes-style,
also come after ``</think>``). Clients get ANSWER: the tags are markup, not text.

Rules (vLLM's ``ernie45`` reasoning parser, made chunking-invariant), applied to the
content stream after the reasoning split and the tool parser:

- ``<response>`` counts only at the start of the content (after optional newlines); it is
  dropped with the newlines around it. Content that does not start with it passes unchanged.
- ``</response>`` counts only at the end of the output (followed by whitespace at most); it is
  dropped with the newlines before it and the whitespace after. Anywhere else it is literal
  text: it is held back while it might be the end and released once more text follows.
- Output cut off inside the answer (max_tokens) gives the text so far, without the tag.
"""

from __future__ import annotations

from enum import Enum

from edgemoe.server.parsers.base import (
    WS,
    FedOnce,
    ParsedDelta,
    ReasoningParser,
    Scan,
    ToolParser,
    expect,
    hold_start,
)
from edgemoe.server.parsers.response import ResponseParser

ANSWER_OPEN = "<response>"
ANSWER_CLOSE = "</response>"

# Families whose models wrap their answer in the tags (ERNIE-4.5-*-Thinking).
_ANSWER_TAG_MODEL_TYPES = frozenset({"ernie4_5_moe"})


def strips_answer_tags(model_type: str, template_source: str) -> bool:
    """Whether a served model's content is read through `AnswerTagFilter`: its family writes
    the tags, or its chat template names them (a template teaching the shape to any model)."""
    return model_type in _ANSWER_TAG_MODEL_TYPES or ANSWER_OPEN in template_source


class _Phase(Enum):
    START = "start"  # a <response> may still open the content
    ANSWER = "answer"  # inside <response>: a final </response> is dropped
    PLAIN = "plain"  # no tag opened the content: everything passes


class AnswerTagFilter(FedOnce[str]):
    """Streaming filter over content text; see the module docstring for the rules.

    ``feed`` any number of times, then ``finish`` once; the concatenated output does not
    depend on how the text was split. Not thread-safe: one instance per response.
    """

    def __init__(self) -> None:
        self._phase = _Phase.START
        FedOnce.__init__(self)
        self._pos = 0
        self._lstrip = False  # drop "\n" at pos: just after <response>
        self._out: list[str] = []

    def _drain(self, final: bool) -> str:
        while self._step(final):
            pass
        self.buf, self._pos = self.buf[self._pos :], 0
        out, self._out = "".join(self._out), []
        return out

    def _step(self, final: bool) -> bool:
        """Advance as far as no later text could change; False: wait (or done)."""
        if self._phase is _Phase.START:
            return self._step_start(final)
        if self._phase is _Phase.PLAIN:
            self._emit_to(len(self.buf))
            return False
        if self._lstrip:
            while self._pos < len(self.buf) and self.buf[self._pos] == "\n":
                self._pos += 1
            if self._pos == len(self.buf):
                return False  # more newlines may follow the tag
            self._lstrip = False
        return self._step_answer(final)

    def _step_start(self, final: bool) -> bool:
        first = len(self.buf) - len(self.buf.lstrip("\n"))
        end = expect(self.buf, first, ANSWER_OPEN)
        if isinstance(end, int):
            self._pos, self._phase, self._lstrip = end, _Phase.ANSWER, True
            return True
        if end is Scan.NEED and not final:
            return False  # empty, newlines only, or a prefix of the tag so far
        self._phase = _Phase.PLAIN  # no tag: the newlines before the text are the text's
        return True

    def _step_answer(self, final: bool) -> bool:
        buf, pos = self.buf, self._pos
        i = buf.find(ANSWER_CLOSE, pos)
        if i < 0:
            self._emit_to(len(buf) if final else hold_start(buf, pos, ANSWER_CLOSE, "\n"))
            return False
        after = i + len(ANSWER_CLOSE)
        if buf[after:].strip(WS):  # text follows: a literal tag, the answer goes on
            self._emit_to(after)
            return True
        newlines = len(buf[pos:i]) - len(buf[pos:i].rstrip("\n"))
        self._emit_to(i - newlines)  # held: the end of the answer, unless more text follows
        if final:
            self._pos = len(buf)
        return False

    def _emit_to(self, end: int) -> None:
        self._out.append(self.buf[self._pos : end])
        self._pos = end


class AnswerTagResponseParser(ResponseParser):
    """`ResponseParser` whose content (after the tool parser took the calls out) goes
    through `AnswerTagFilter`: a ``</response>`` right before a trailing call is then still
    the end of the answer."""

    def __init__(
        self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None
    ) -> None:
        super().__init__(reasoning, tools)
        self._answer = AnswerTagFilter()

    def feed(self, text: str) -> ParsedDelta:
        delta = super().feed(text)
        return ParsedDelta(self._answer.feed(delta.content), delta.reasoning, delta.tool_calls)

    def finish(self, cut: bool = False) -> ParsedDelta:
        delta = super().finish(cut)
        content = self._answer.feed(delta.content) + self._answer.finish()
        return ParsedDelta(content, delta.reasoning, delta.tool_calls)
