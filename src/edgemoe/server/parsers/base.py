"""Protocol-neutral parser outputs and the parser contracts (the combined pipeline: `response.py`).

Every parser here is a streaming state machine with one invariant that the protocol
adapters rely on: the concatenation of everything emitted by ``feed(...)`` calls and
the final ``finish()`` does not depend on how the model text was split into chunks.
``parse_complete(text)`` is defined as one ``feed(text)`` plus ``finish()``, so the
non-streamed result equals the streamed concatenation by construction.

How the output ended matters to a tool parser only at ``finish(cut=...)``: see
``ToolParser`` (a length cut inside an announced call drops the call's raw tail).
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

IdFactory = Callable[[], str]
ToolSpec = Mapping[str, Any]


def new_call_id() -> str:
    """Default tool-call id: ``call_`` + 24 random hex digits (OpenAI's shape)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCallDelta:
    """One streamed piece of one tool call.

    ``id`` and ``name`` are set only on the first delta of a call; ``arguments``
    fragments of one ``index``, concatenated, are the call's complete JSON object text.
    """

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass
class ParsedDelta:
    """What one ``feed``/``finish`` produced: visible text, reasoning, call pieces."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.content or self.reasoning or self.tool_calls)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON object text


@dataclass
class ParsedMessage:
    """A whole response, parsed (the non-streamed result)."""

    content: str
    reasoning: str
    tool_calls: list[ToolCall]


class ReasoningDelta(NamedTuple):
    reasoning: str
    content: str


def accumulate(deltas: Iterable[ParsedDelta]) -> ParsedMessage:
    """Fold streamed deltas into the message they describe."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, ToolCall] = {}
    for delta in deltas:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
        for piece in delta.tool_calls:
            call = calls.get(piece.index)
            if call is None:
                # NOTE: the first delta of a call always carries id and name.
                calls[piece.index] = ToolCall(piece.id or "", piece.name or "", piece.arguments)
            else:
                call.arguments += piece.arguments
    ordered = [calls[i] for i in sorted(calls)]
    return ParsedMessage("".join(content), "".join(reasoning), ordered)


D = TypeVar("D")


class FedOnce(Generic[D]):
    """A streaming parser's text fed in pieces into ``buf``, then finished once: `feed`
    drains as far as no later text could change, `finish` drains the rest (each subclass's
    `_drain`); feeding after `finish`, or finishing twice, raises ``RuntimeError``. Listed
    first among a parser's bases, so its `feed` and `finish` are the ones called."""

    def __init__(self) -> None:
        self.buf = ""
        self._finished = False

    def feed(self, text: str) -> D:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> D:
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._drain(final=True)

    def _drain(self, final: bool) -> D:
        """Parse as far as the buffer allows (all of it when `final`): the new delta."""
        raise NotImplementedError


class ReasoningParser(ABC):
    """Splits model output into reasoning and content, incrementally.

    Contract: ``feed`` may be called any number of times, then ``finish`` exactly once;
    ``feed`` after ``finish`` raises ``RuntimeError``. Text that might still turn out
    to be a tag is held back until resolved; ``finish`` releases everything held, so
    no text is lost except the tags and the whitespace conventions each parser states.
    Not thread-safe: one instance per response.
    """

    @abstractmethod
    def feed(self, text: str) -> ReasoningDelta: ...

    @abstractmethod
    def finish(self) -> ReasoningDelta: ...


class ToolParser(ABC):
    """Extracts tool calls from content text, incrementally.

    Contract: as for ``ReasoningParser`` (feed*, finish once, one instance per
    response). Returned deltas carry no reasoning, unless ``reads_whole_output``: a
    format whose markup frames every message (harmony's channels) is read whole by its
    tool parser, tools or not, reasoning included, with no reasoning parser before it.
    Call indices are 0-based and contiguous per response. Every call emitted is closed by the time ``finish``
    returns, and its concatenated arguments are a valid JSON object text.

    ``finish(cut=True)``: the output ended by a length limit (``max_tokens`` or the
    context), not by the model. A call already announced (its name streamed) that the
    parser was still reading is then closed with the arguments it completed, and its
    unfinished raw tail (a half-written value, a pair's or the next call's tag cut off in
    the same block) is dropped, not returned as content: it is markup the limit cut, and a
    value cut short must not read as whole. Text that broke the format before the end
    still degrades to content. ``cut=False`` (EOS, a stop string): the model itself ended
    inside the call, so its raw text is content, as each format states. Text before a call
    was announced is unaffected either way (a forced call's: ``forced_call.PrimedParser``).

    ``tools`` is the request's tool list (OpenAI ``{"type": "function", "function":
    {...}}``, the flat Responses shape, or Anthropic's ``input_schema``); parsers that
    type values by schema use it, others ignore it. ``id_factory`` makes call ids
    (inject a counter in tests).
    """

    reads_whole_output: ClassVar[bool] = False

    def __init__(
        self, tools: Sequence[ToolSpec] | None = None, id_factory: IdFactory | None = None
    ) -> None:
        self.tools: list[ToolSpec] = list(tools or [])
        self.new_id: IdFactory = id_factory or new_call_id

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta: ...

    @abstractmethod
    def finish(self, cut: bool = False) -> ParsedDelta: ...

    @property
    @abstractmethod
    def tool_calls_emitted(self) -> int:
        """Calls started so far; callers set ``finish_reason = "tool_calls"`` when > 0."""


class Scan(Enum):
    """Outcome of matching at a position when it is not a position to continue at."""

    NEED = "need more text"  # what is there is a prefix of a match: wait
    FAIL = "no match"  # no continuation can match


WS = " \t\r\n"  # JSON's whitespace; also what tool parsers trim around calls
_WS_RUN = re.compile(r"[ \t\r\n]*")


def skip_ws(buf: str, pos: int) -> int:
    return _WS_RUN.match(buf, pos).end()  # type: ignore[union-attr]  # always matches


def expect(buf: str, pos: int, literal: str) -> int | Scan:
    """Position after ``literal`` at ``pos``; NEED if the buffer ends inside it."""
    if buf.startswith(literal, pos):
        return pos + len(literal)
    rest = buf[pos:]
    if len(rest) < len(literal) and literal.startswith(rest):
        return Scan.NEED
    return Scan.FAIL


def hold_start(buf: str, pos: int, tag: str, ws: str) -> int:
    """Where the held-back tail of ``buf[pos:]`` starts.

    The tail is the longest suffix that is a proper prefix of ``tag``, preceded by the
    run of ``ws`` characters before it: both may still turn out to belong to a tag.
    """
    end = len(buf)
    start = end
    for k in range(min(len(tag) - 1, end - pos), 0, -1):
        if tag.startswith(buf[end - k :]):
            start = end - k
            break
    while start > pos and buf[start - 1] in ws:
        start -= 1
    return start


def dumps(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud83d") breaks the HTTP body
        text = json.dumps(value)
    return text


def merge_call_deltas(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Join consecutive pieces of the same call so one chunk carries one entry per call."""
    merged: list[ToolCallDelta] = []
    for d in deltas:
        if merged and merged[-1].index == d.index:
            merged[-1].arguments += d.arguments
        else:
            merged.append(ToolCallDelta(d.index, d.id, d.name, d.arguments))
    return merged


class BufferedToolParser(FedOnce[ParsedDelta], ToolParser):
    """A tool parser over a text buffer: `feed` appends to ``buf`` and drains, `finish`
    drains once more with ``final`` (a step must then resolve); each call's steps are the
    subclass's `_drain`. Counts its calls in ``_count``. ``cut_by_length``: `finish` was told
    the output ended by a length limit (``ToolParser``); the final drain's steps read it."""

    def __init__(self, tools: Sequence[ToolSpec] | None = None, id_factory: IdFactory | None = None) -> None:
        ToolParser.__init__(self, tools, id_factory)
        FedOnce.__init__(self)
        self._count = 0
        self.cut_by_length = False

    def finish(self, cut: bool = False) -> ParsedDelta:
        if not self._finished:
            self.cut_by_length = cut
        return FedOnce.finish(self)

    @property
    def tool_calls_emitted(self) -> int:
        return self._count

    def _length_cut(self, need: bool) -> bool:
        """Whether an announced call still reading (`need`: the text so far is a prefix of
        more of it, nothing broke the format) was stopped by the length limit, not the model."""
        return self.cut_by_length and need

    @abstractmethod
    def _drain(self, final: bool) -> ParsedDelta:
        """Parse as far as the buffer allows (all of it when `final`): the new delta."""


class TaggedToolParser(BufferedToolParser):
    """Shared machinery of formats that wrap each call in ``<tool_call>…</tool_call>``.

    Outside a call (text mode) text is content, except a held-back tail that could
    still start ``<tool_call>``. Whitespace adjacent to a call (the run before its
    ``<tool_call>`` and the run after it ends) is dropped. Inside a call the subclass's
    ``_step_call`` parses from ``self.pos``; it announces the call with ``_commit`` once
    the name is certain, adds arguments with ``_member``, and leaves with ``_end_call``
    (after a commit: the arguments object is always closed) or ``_reject`` (before a
    commit: the tag and the text given back are content).

    NOTE: steps decide only what no continuation of the buffer could change; at
    ``finish`` a step must resolve, so the stream never ends inside a call. A committed
    call the length limit cut (``_length_cut``) ends with ``_drop_tail``.
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"

    def __init__(
        self, tools: Sequence[ToolSpec] | None = None, id_factory: IdFactory | None = None
    ) -> None:
        super().__init__(tools, id_factory)
        self.pos = 0
        self.in_call = False
        self._call_start = 0  # where the current call's <tool_call> begins
        self._call_ws = ""  # whitespace before it, given back if it is no call
        self._lstrip = False  # drop whitespace at pos (a call just ended)
        self._members = 0
        self._args_open = False
        self._content: list[str] = []
        self._calls: list[ToolCallDelta] = []

    @abstractmethod
    def _begin_call(self) -> None:
        """Reset per-call state; ``self.pos`` is just after ``<tool_call>``."""

    @abstractmethod
    def _step_call(self, final: bool) -> bool:
        """Advance inside a call; False means "wait for more text" (never when final)."""

    def _drain(self, final: bool) -> ParsedDelta:
        while self._step_call(final) if self.in_call else self._step_text(final):
            pass
        if not self.in_call:  # positions inside a call stay valid: compact between calls
            self.buf, self.pos = self.buf[self.pos :], 0
        out = ParsedDelta("".join(self._content), "", merge_call_deltas(self._calls))
        self._content, self._calls = [], []
        return out

    def _step_text(self, final: bool) -> bool:
        buf, pos = self.buf, self.pos
        if self._lstrip:
            while pos < len(buf) and buf[pos] in WS:
                pos += 1
            self.pos = pos
            if pos == len(buf):
                return False
            self._lstrip = False
        i = buf.find(self.OPEN, pos)
        if i < 0:
            end = len(buf) if final else hold_start(buf, pos, self.OPEN, WS)
            self._content.append(buf[pos:end])
            self.pos = end
            return False
        ws = i
        while ws > pos and buf[ws - 1] in WS:
            ws -= 1
        self._content.append(buf[pos:ws])
        self._call_ws, self._call_start = buf[ws:i], i
        self.pos, self.in_call = i + len(self.OPEN), True
        self._begin_call()
        return True

    def _reject(self, resume: int | None = None) -> None:
        """No call after all: content gets the tag and the text up to ``resume``."""
        if resume is None:  # default: rescan right after the tag
            resume = self._call_start + len(self.OPEN)
        self._content.append(self._call_ws + self.buf[self._call_start : resume])
        self.pos, self.in_call = resume, False

    def _commit(self, name: str) -> None:
        self._calls.append(ToolCallDelta(self._count, self.new_id(), name, ""))
        self._count += 1
        self._members, self._args_open = 0, True

    def _member(self, key: str, value: Any) -> None:
        sep = "{" if self._members == 0 else ", "
        self._members += 1
        self._piece(f"{sep}{dumps(key)}: {dumps(value)}")

    def _piece(self, arguments: str) -> None:
        self._calls.append(ToolCallDelta(self._count - 1, None, None, arguments))

    def _close_args(self) -> None:
        if self._args_open:
            self._args_open = False
            self._piece("}" if self._members else "{}")

    def _end_call(self, resume: int, lstrip: bool) -> None:
        """Leave a committed call; text from ``resume`` on is parsed as text again."""
        self._close_args()
        self.pos, self.in_call, self._lstrip = resume, False, lstrip

    def _drop_tail(self) -> None:
        """The length limit cut a committed call: it closes with the arguments it completed,
        and the rest of the output (the call's unfinished raw markup) is no content."""
        self._end_call(len(self.buf), lstrip=True)

