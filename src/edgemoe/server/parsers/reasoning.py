"""``<think>`` … ``</think>`` reasoning split (Qwen3, Qwen3.5+, DeepSeek-R1 style).

Behaviour (vLLM's Qwen3 parser, made chunking-invariant):

- ``starts_in_reasoning=True``: the prompt already opened ``<think>`` (Qwen3 thinking
  templates, Qwen3-2507 thinking, Qwen3.5+). Output is reasoning until ``</think>``;
  a ``<think>`` that the model writes again at the very start is dropped. If the
  output stops before ``</think>`` everything is reasoning (vLLM's streaming path does
  this; its non-streamed path calls it content, which a stream cannot know in time).
- ``starts_in_reasoning=False``: output is content unless it starts (after optional
  whitespace) with ``<think>`` (older Qwen3 templates, where the model opens the block).
- Only the first ``</think>`` ends reasoning. After that, and whenever the output does
  not start in reasoning, ``<think>``/``</think>`` are literal content (unlike vLLM,
  which looks for ``<think>`` anywhere in non-streamed output and drops text before it).
- Thinking disabled: give ``ResponseParser`` no reasoning parser at all, so every
  byte is content; the template already wrote ``<think>\\n\\n</think>\\n\\n``.
- Newlines: reasoning loses its leading and trailing ``\\n`` characters and content
  after ``</think>`` its leading ones, which is exactly what the Qwen3 template strips
  (``reasoning_content.strip('\\n')``, ``content.lstrip('\\n')``) when it renders the
  turn back into history; so history round-trips byte for byte.
"""

from __future__ import annotations

from enum import Enum

from edgemoe.server.parsers.base import (
    FedOnce,
    ReasoningDelta,
    ReasoningParser,
    Scan,
    expect,
    hold_start,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def prompt_opens_reasoning(prompt: str) -> bool:
    """True when a rendered prompt ends inside an open ``<think>`` block."""
    return prompt.rstrip().endswith(THINK_OPEN)


def close_open_reasoning(prompt: str) -> str:
    """What closes the ``<think>`` block a rendered prompt left open ('' if none): a
    template that ignores ``enable_thinking`` (MiniMax-M2's) still opens one, and a forced
    call must not start inside reasoning. Closed as Qwen's templates close an empty one."""
    return THINK_CLOSE + "\n\n" if prompt_opens_reasoning(prompt) else ""


class _Phase(Enum):
    START = "start"  # a <think> may still open the output
    REASONING = "reasoning"
    CONTENT = "content"


class ThinkReasoningParser(FedOnce[ReasoningDelta], ReasoningParser):
    """Streaming ``<think>`` splitter; see the module docstring for the rules."""

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        self.starts_in_reasoning = starts_in_reasoning
        self._phase = _Phase.START
        FedOnce.__init__(self)
        self._pos = 0
        self._lstrip = False  # drop "\n" at pos: just after a tag
        self._reasoning: list[str] = []
        self._content: list[str] = []

    def _drain(self, final: bool) -> ReasoningDelta:
        while self._step(final):
            pass
        self.buf, self._pos = self.buf[self._pos :], 0
        out = ReasoningDelta("".join(self._reasoning), "".join(self._content))
        self._reasoning, self._content = [], []
        return out

    def _step(self, final: bool) -> bool:
        if self._phase is _Phase.START:
            return self._step_start(final)
        if self._lstrip:
            while self._pos < len(self.buf) and self.buf[self._pos] == "\n":
                self._pos += 1
            if self._pos == len(self.buf):
                return False
            self._lstrip = False
        if self._phase is _Phase.REASONING:
            return self._step_reasoning(final)
        self._content.append(self.buf[self._pos :])
        self._pos = len(self.buf)
        return False

    def _step_start(self, final: bool) -> bool:
        p = len(self.buf) - len(self.buf[self._pos :].lstrip())
        end = expect(self.buf, p, THINK_OPEN)
        if isinstance(end, int):
            self._pos, self._phase, self._lstrip = end, _Phase.REASONING, True
            return True
        if end is Scan.NEED and not final:
            return False
        # No tag: the text (leading whitespace included) belongs where the output starts.
        if self.starts_in_reasoning:
            self._phase, self._lstrip = _Phase.REASONING, True
        else:
            self._phase = _Phase.CONTENT
        return True

    def _step_reasoning(self, final: bool) -> bool:
        buf, pos = self.buf, self._pos
        i = buf.find(THINK_CLOSE, pos)
        if i >= 0:
            self._reasoning.append(buf[pos:i].rstrip("\n"))
            self._pos, self._phase, self._lstrip = i + len(THINK_CLOSE), _Phase.CONTENT, True
            return True
        if final:
            self._reasoning.append(buf[pos:].rstrip("\n"))
            self._pos = len(buf)
            return False
        end = hold_start(buf, pos, THINK_CLOSE, "\n")
        self._reasoning.append(buf[pos:end])
        self._pos = end
        return False
