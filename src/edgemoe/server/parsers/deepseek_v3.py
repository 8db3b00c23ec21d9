"""DeepSeek-V3 / V3.1 / R1 tool calls (what vLLM calls ``deepseek_v3`` / ``deepseek_v31``).

Format: one section of calls, each call's arguments a JSON object. DeepSeek-V3.1's (and
V3.2-Exp's) chat template writes::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>

and DeepSeek-V3(-0324) / R1(-0528)'s writes the call's type first and fences the arguments
(``\\n`` between calls)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {ARGS}
    ```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>

Both spellings are read, in any mix (the markers use U+FF5C ``｜`` and U+2581 ``▁``): a word
after ``<｜tool▁sep｜>`` makes the word before it the type, else that one is the name; a
fence (three backticks, with or without a language word) around the object is optional.
Any whitespace may separate the parts. Text before the section is content (the whitespace run before
``<｜tool▁calls▁begin｜>`` and after ``<｜tool▁calls▁end｜>`` is dropped), and so is text after it.

Streaming (as the Hermes parser streams): id + name once the ``{`` that opens the
arguments has been read, then each top-level member once its value is complete, as
``{"k": v`` / ``, "k": v``, and ``}`` when the object closes; values are re-serialised.
A section whose first call is no call (no name, no object, or cut off before its ``{``)
is text: ``<｜tool▁calls▁begin｜>`` stays content and what follows is read again as text.
After a call was announced, invalid JSON (or the model's end, EOS or a stop string,
inside it) closes its arguments with the members completed so far, and the rest of the raw
text is content; so is the rest from a later ``<｜tool▁call▁begin｜>`` that opens no call, or
from anything else where a call or the section's end should be. At the end of the output a
section cut off after a call (its closing markers stopped) keeps its calls. A length limit
(max_tokens, the context) that cuts the section after a call was announced closes that call
with the completed members and drops the rest of the section's text (``ToolParser``): a
member cut short, the next call's marker or head cut off.

NOTE: the markers are added tokens that DeepSeek's tokenizer does not flag special, so
the detokenizer keeps them with the server's default ``skip_special_tokens=True``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from edgemoe.server.parsers.base import IdFactory, Scan, TaggedToolParser, ToolSpec, expect, skip_ws
from edgemoe.server.parsers.hermes import MAX_NAME, Member, ObjectEnd, ValueScan, parse_member

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE = "```"
MAX_LANGUAGE = 16  # a fence's language word ("json"); longer is no fence

# A name (or type) is one run of these: a marker, the arguments' brace or a fence ends it.
_NAME = re.compile(r"""[^\s<>{}\[\]"'`]*""")
_LANGUAGE = re.compile(r"[A-Za-z]*")


def writable_name(name: str) -> bool:
    """Whether a call to `name` reads back as that name (forced_call's check)."""
    return 0 < len(name) <= MAX_NAME and _NAME.fullmatch(name) is not None


def fenced_template(source: str) -> bool:
    """Whether a chat template teaches V3/R1's spelling (type first, fenced arguments)."""
    return FENCE + "json" in source


def call_opening(name: str | None, fenced: bool) -> str:
    """The forced opening of a call, as the template writes a call turn after its
    ``<｜Assistant｜>`` (V3.1: ``…NAME<｜tool▁sep｜>``; V3/R1, ``fenced``: through the
    fence's ``json\\n``; any tool: up to the call's name)."""
    head = CALLS_BEGIN + CALL_BEGIN
    if name is None:
        return head
    return f"{head}function{SEP}{name}\n{FENCE}json\n" if fenced else f"{head}{name}{SEP}"


class Opening(NamedTuple):
    name: str
    args_pos: int  # just after the "{" that opens the arguments object
    fenced: bool


def _word(buf: str, pos: int) -> tuple[str, int] | Scan:
    """The name-like run at ``pos`` and its end; NEED while it may still grow."""
    end = _NAME.match(buf, pos).end()  # type: ignore[union-attr]  # matches empty
    if end - pos > MAX_NAME:
        return Scan.FAIL
    if end == len(buf):
        return Scan.NEED
    return (buf[pos:end], end) if end > pos else Scan.FAIL  # a marker, brace or quote: no name


def _skip_fence(buf: str, pos: int) -> tuple[int, bool] | Scan:
    """Past an opening fence (```` ```json ````) at ``pos`` if there is one: the position and whether."""
    r = expect(buf, pos, FENCE)
    if r is Scan.FAIL:
        return pos, False
    if r is Scan.NEED:
        return r
    assert isinstance(r, int)
    end = _LANGUAGE.match(buf, r).end()  # type: ignore[union-attr]  # matches empty
    if end - r > MAX_LANGUAGE:
        return Scan.FAIL
    return Scan.NEED if end == len(buf) else (end, True)


def parse_opening(buf: str, pos: int) -> Opening | Scan:
    """``NAME<｜tool▁sep｜>{`` or ``TYPE<｜tool▁sep｜>NAME ```json {`` after
    ``<｜tool▁call▁begin｜>``, whitespace-tolerant, through the arguments' ``{``."""
    first = _word(buf, skip_ws(buf, pos))
    if not isinstance(first, tuple):
        return first
    sep = expect(buf, skip_ws(buf, first[1]), SEP)
    if not isinstance(sep, int):
        return sep
    p = skip_ws(buf, sep)
    name = first[0]
    if p < len(buf) and buf[p] not in "{`":  # V3/R1: the word before the separator was the type
        second = _word(buf, p)
        if not isinstance(second, tuple):
            return second
        name, p = second[0], skip_ws(buf, second[1])
    fence = _skip_fence(buf, p)
    if not isinstance(fence, tuple):
        return fence
    p = skip_ws(buf, fence[0])
    if p == len(buf):
        return Scan.NEED
    return Opening(name, p + 1, fence[1]) if buf[p] == "{" else Scan.FAIL


class _Phase(Enum):
    SECTION = "section"  # between calls: expecting a call or the section's end
    HEADER = "header"  # after <｜tool▁call▁begin｜>: up to the arguments' "{"
    ARGS = "args"  # committed: inside the arguments object
    TAIL = "tail"  # arguments closed: the fence's close, then <｜tool▁call▁end｜>


class DeepSeekV3ToolParser(TaggedToolParser):
    """Streaming parser for DeepSeek-V3 / V3.1 / R1 tool calls (see the module docstring).

    A "call" of `TaggedToolParser` is here a whole section, from ``<｜tool▁calls▁begin｜>``
    to ``<｜tool▁calls▁end｜>``: the calls inside it are committed one after another."""

    OPEN = CALLS_BEGIN
    CLOSE = CALLS_END

    def __init__(self, tools: Sequence[ToolSpec] | None = None, id_factory: IdFactory | None = None) -> None:
        super().__init__(tools, id_factory)
        self._begin_call()

    def _begin_call(self) -> None:
        self._phase = _Phase.SECTION
        self._section_calls = 0  # calls committed in this section
        self._call_begin = 0  # where the current call's <｜tool▁call▁begin｜> starts
        self._fenced = False  # the current call's arguments opened a fence still to close
        self._memo = ValueScan()

    def _step_call(self, final: bool) -> bool:
        if self._phase is _Phase.SECTION:
            return self._step_section(final)
        if self._phase is _Phase.HEADER:
            return self._step_header(final)
        if self._phase is _Phase.ARGS:
            return self._step_args(final)
        return self._step_tail(final)

    def _step_section(self, final: bool) -> bool:
        buf = self.buf
        p = skip_ws(buf, self.pos)
        begin = expect(buf, p, CALL_BEGIN)
        if isinstance(begin, int):
            self._call_begin, self.pos, self._phase = p, begin, _Phase.HEADER
            return True
        end = expect(buf, p, self.CLOSE)
        if isinstance(end, int) and self._section_calls:
            self._end_call(end, lstrip=True)
            return True
        if Scan.NEED in (begin, end) and not final:
            return False
        if not self._section_calls:
            self._reject()  # no call in it (or cut off before one): the section's marker is text
        elif p == len(buf) or end is Scan.NEED:
            self._end_call(len(buf), lstrip=True)  # the stop cut the closing markers
        elif self._length_cut(begin is Scan.NEED):
            self._drop_tail()  # the length limit cut the next call's marker: the section's markup
        else:
            self._end_call(p, lstrip=False)  # not the format: the rest is text
        return True

    def _step_header(self, final: bool) -> bool:
        opening = parse_opening(self.buf, self.pos)
        if isinstance(opening, Opening):
            self._commit(opening.name)
            self._section_calls += 1
            self._fenced, self._memo = opening.fenced, ValueScan()
            self.pos, self._phase = opening.args_pos, _Phase.ARGS
            return True
        if opening is Scan.NEED and not final:
            return False
        if self._section_calls and self._length_cut(opening is Scan.NEED):
            self._drop_tail()  # the length limit cut the next call's head: the section's markup
        elif self._section_calls:
            self._end_call(self._call_begin, lstrip=False)  # no call here: from its marker on, text
        else:
            self._reject()  # the section opens with no call: text, read again after its marker
        return True

    def _step_args(self, final: bool) -> bool:
        r = parse_member(self.buf, self.pos, self._members == 0, self._memo)
        if isinstance(r, Member):
            self._member(r.key, r.value)
            self.pos = r.end
            return True
        if isinstance(r, ObjectEnd):
            self._close_args()
            self.pos, self._phase = r.end, _Phase.TAIL
            return True
        if r is Scan.NEED and not final:
            return False
        if self._length_cut(r is Scan.NEED):
            self._drop_tail()  # the length limit cut the arguments: the completed members only
        else:
            self._end_call(self.pos, lstrip=False)  # broken, or the model ended inside: the rest is text
        return True

    def _step_tail(self, final: bool) -> bool:
        buf = self.buf
        p = skip_ws(buf, self.pos)
        if self._fenced:
            fence = expect(buf, p, FENCE)
            if fence is Scan.NEED and not final:
                return False
            if isinstance(fence, int):
                p = skip_ws(buf, fence)
            elif fence is Scan.NEED:
                p = len(buf)  # the end of the output: a fence the stop cut off counts as closed
            self.pos, self._fenced = p, False  # a fence left open is forgiven
        end = expect(buf, p, CALL_END)
        if end is Scan.NEED and not final:
            return False
        # A missing <｜tool▁call▁end｜> is forgiven too: the section's rules read what follows
        # (a marker cut off by the stop counts as complete).
        self.pos = end if isinstance(end, int) else len(buf) if end is Scan.NEED else p
        self._phase = _Phase.SECTION
        return True
