"""Hermes / Qwen2.5 / Qwen3 JSON tool calls.

Format: ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``, several in a row.

Streaming: the call is announced (id + name) as soon as ``{"name": "<string>",
"arguments": {`` has been read, then each top-level argument is emitted once its value
is complete, as ``{"k": v`` / ``, "k": v``, and ``}`` when the object closes. Values
are re-serialised (``json.dumps(..., ensure_ascii=False)``), so a call's arguments are
always ``json.dumps(arguments_dict, ensure_ascii=False)`` — valid JSON even when the
model wrote raw control characters inside strings.

Any other JSON shape (``arguments`` first, arguments as a JSON string, ``parameters``)
is parsed whole when ``</tool_call>`` arrives. ``<tool_call>`` not followed by ``{`` is
prose: the tag stays content. Invalid JSON before the call was announced: the raw
text through ``</tool_call>`` is content, no call. Invalid or unfinished JSON after it
was announced (the name cannot be taken back): the call keeps the arguments completed
so far, its object is closed, and the rest of the raw text is content. When a length
limit (max_tokens, the context) cut it unfinished, the rest is dropped instead
(``ToolParser``). No raw JSON of the arguments is ever streamed: a member is sent once its
value is complete (a number once what follows ends it), so what was streamed is always a
prefix of the final, valid object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from edgemoe.server.parsers.base import Scan, TaggedToolParser, expect, skip_ws
from edgemoe.tool_values import round_trip_json

# A complete JSON string (unrolled loop: linear, no backtracking blow-up).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STRUCT = re.compile(r'[{}\[\]"]')
_SCALAR = re.compile(r"[^ \t\r\n,\]}]*")
_IN_STRING = re.compile(r'["\\]')


def loads(text: str) -> Any:
    """Lenient on raw control characters in strings, strict on NaN/Infinity/overflow.

    Raises ValueError only: model output nested past Python's recursion limit raises
    RecursionError in the decoder, which callers (catching ValueError) would let through
    as a failed response instead of treating the text as not-a-call."""
    try:
        return round_trip_json(text, strict=False)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def scan_string(buf: str, pos: int) -> int | Scan:
    """End of the JSON string opening at ``pos`` (NEED while unterminated)."""
    m = _STRING.match(buf, pos)
    return m.end() if m else Scan.NEED


@dataclass
class ValueScan:
    """Where a scan of one value stopped, so the next feed resumes instead of rescanning."""

    start: int = -1  # the value this state belongs to
    pos: int = 0  # everything before is settled
    depth: int = 0
    in_string: bool = False


def scan_value(buf: str, pos: int, memo: ValueScan | None = None) -> int | Scan:
    """End of the JSON value starting at ``pos`` (structure only; loads() validates)."""
    if pos >= len(buf):
        return Scan.NEED
    if buf[pos] not in '"{[':
        end = _SCALAR.match(buf, pos).end()  # type: ignore[union-attr]  # matches empty
        if end == pos:
            return Scan.FAIL
        return Scan.NEED if end == len(buf) else end  # a number may still grow
    st = memo if memo is not None else ValueScan()
    if st.start != pos:
        st.start, st.depth = pos, 0
        st.in_string, st.pos = buf[pos] == '"', pos + (buf[pos] == '"')
    while True:
        m = (_IN_STRING if st.in_string else _STRUCT).search(buf, st.pos)
        if m is None:
            st.pos = len(buf)
            return Scan.NEED
        c, st.pos = m.group(), m.end()
        if c == "\\":
            if st.pos == len(buf):
                st.pos = m.start()  # the escaped character has not arrived
                return Scan.NEED
            st.pos += 1
        elif c == '"':
            st.in_string = not st.in_string
        else:
            st.depth += 1 if c in "{[" else -1
        if st.depth == 0 and not st.in_string:
            return st.pos


class Member(NamedTuple):
    key: str
    value: Any
    end: int


class ObjectEnd(NamedTuple):
    end: int  # just after the closing brace


def parse_member(
    buf: str, pos: int, first: bool, memo: ValueScan | None = None
) -> Member | ObjectEnd | Scan:
    """The next ``"key": value`` (after a comma unless ``first``) or the closing brace."""
    p = skip_ws(buf, pos)
    if p == len(buf):
        return Scan.NEED
    if buf[p] == "}":
        return ObjectEnd(p + 1)
    if not first:
        if buf[p] != ",":
            return Scan.FAIL
        p = skip_ws(buf, p + 1)
    if p == len(buf):
        return Scan.NEED
    if buf[p] != '"':
        return Scan.FAIL
    key_end = scan_string(buf, p)
    if key_end is Scan.NEED:
        return key_end
    colon = expect(buf, skip_ws(buf, key_end), ":")
    if not isinstance(colon, int):
        return colon
    v = skip_ws(buf, colon)
    value_end = scan_value(buf, v, memo)
    if not isinstance(value_end, int):
        return value_end
    try:
        return Member(loads(buf[p:key_end]), loads(buf[v:value_end]), value_end)
    except ValueError:
        return Scan.FAIL


class Header(NamedTuple):
    name: str
    args_pos: int  # just after the "{" that opens the arguments object


_BEFORE_NAME = ("{", '"name"', ":")
_AFTER_NAME = (",", '"arguments"', ":", "{")


def _expect_all(buf: str, pos: int, parts: tuple[str, ...]) -> int | Scan:
    for part in parts:
        r = expect(buf, skip_ws(buf, pos), part)
        if not isinstance(r, int):
            return r
        pos = r
    return pos


# Longer is no tool's name (OpenAI's and Anthropic's allow 64 characters; MCP prefixes add
# some). A name's JSON text holds at most 12 characters per character (a surrogate pair's
# escapes), so an unterminated one past 12 x MAX_NAME can't end as a name either.
MAX_NAME = 256


def plausible_name(name: str) -> bool:
    """Whether a call may name `name`: not blank, no line break, at most MAX_NAME long."""
    return bool(name.strip()) and len(name) <= MAX_NAME and "\n" not in name and "\r" not in name


def parse_header(buf: str, pos: int) -> Header | Scan | None:
    """``{"name": "<string>", "arguments": {`` at ``pos``, whitespace-tolerant. None: the
    object opens with a name no call can have (not a string, not a plausible name, or a
    string that no JSON object continues from), so it is text, decided as soon as it shows:
    prose after a forced call's opening streams instead of waiting for the end."""
    p = _expect_all(buf, pos, _BEFORE_NAME)
    if not isinstance(p, int):
        return p
    p = skip_ws(buf, p)
    if p == len(buf):
        return Scan.NEED
    if buf[p] != '"':
        return None
    end = scan_string(buf, p)
    if not isinstance(end, int):
        raw = buf[p + 1 :]
        return None if "\n" in raw or "\r" in raw or len(raw) > 12 * MAX_NAME else end
    try:
        name = loads(buf[p:end])
    except ValueError:
        return None
    q = skip_ws(buf, end)
    if not plausible_name(name) or (q < len(buf) and buf[q] not in ",}"):
        return None
    args = _expect_all(buf, end, _AFTER_NAME)
    return Header(name, args) if isinstance(args, int) else args


def parse_whole(text: str) -> tuple[str, dict[str, Any]] | None:
    """A complete call object in any common shape, or None if it is not one."""
    try:
        obj = loads(text)
        args = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else None
        if isinstance(args, str):
            args = loads(args) if args.strip() else {}
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not plausible_name(obj["name"]):
        return None
    return (obj["name"], args) if isinstance(args, dict) else None


@dataclass
class _StringAwareScan:
    """Resumable search for ``</tool_call>`` outside JSON strings."""

    pos: int
    in_string: bool = False

    def find(self, buf: str, tag: str) -> int | None:
        while True:
            if self.in_string:
                m = _IN_STRING.search(buf, self.pos)
                if m is None:
                    self.pos = len(buf)
                    return None
                if m.group() == '"':
                    self.in_string, self.pos = False, m.end()
                elif m.end() < len(buf):
                    self.pos = m.end() + 1  # skip the escaped character
                else:
                    self.pos = m.start()  # the escaped character has not arrived
                    return None
                continue
            quote, close = buf.find('"', self.pos), buf.find(tag, self.pos)
            if close >= 0 and (quote < 0 or close < quote):
                return close
            if quote < 0:
                self.pos = max(self.pos, len(buf) - len(tag) + 1)
                return None
            self.in_string, self.pos = True, quote + 1


class _Phase(Enum):
    HEADER = "header"
    ARGS = "args"  # committed: inside the arguments object
    TAIL = "tail"  # arguments closed: rest of the outer object
    CLOSE = "close"  # outer object closed: expecting </tool_call>
    WHOLE = "whole"  # unusual shape: parse at </tool_call>


class HermesToolParser(TaggedToolParser):
    """Streaming parser for Hermes-style JSON tool calls (see the module docstring)."""

    def _begin_call(self) -> None:
        self._phase = _Phase.HEADER
        self._whole: _StringAwareScan | None = None
        self._whole_start = 0
        self._memo = ValueScan()

    def _step_call(self, final: bool) -> bool:
        if self._phase is _Phase.HEADER:
            return self._step_header(final)
        if self._phase is _Phase.ARGS:
            return self._step_args(final)
        if self._phase is _Phase.TAIL:
            return self._step_tail(final)
        if self._phase is _Phase.CLOSE:
            return self._step_close(final)
        return self._step_whole(final)

    def _step_header(self, final: bool) -> bool:
        header = parse_header(self.buf, self.pos)
        if header is None:
            self._reject()  # not a call's name: text, at once
            return True
        if isinstance(header, Header):
            self._commit(header.name)
            self.pos, self._phase = header.args_pos, _Phase.ARGS
            return True
        if header is Scan.NEED and not final:
            return False
        p = skip_ws(self.buf, self.pos)
        if header is Scan.FAIL and p < len(self.buf) and self.buf[p] == "{":
            self._phase, self._whole, self._whole_start = _Phase.WHOLE, _StringAwareScan(p), p
            return True
        self._reject()  # prose mentioning the tag, or cut off before the name
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
        return self._stuck(r, final, lstrip=False)

    def _step_tail(self, final: bool) -> bool:
        """Skip other keys of the outer object (ignored) up to its closing brace."""
        r = parse_member(self.buf, self.pos, False, self._memo)
        if isinstance(r, Member):
            self.pos = r.end
            return True
        if isinstance(r, ObjectEnd):
            self.pos, self._phase = r.end, _Phase.CLOSE
            return True
        return self._stuck(r, final, lstrip=True)

    def _stuck(self, r: Scan, final: bool, lstrip: bool) -> bool:
        """NEED: wait, unless the output ended; FAIL: the call ends, the rest is text. At a
        length cut that needed more (`_length_cut`), the rest is the call's: dropped."""
        if r is Scan.NEED and not final:
            return False
        if self._length_cut(r is Scan.NEED):
            self._drop_tail()
        else:
            self._end_call(self.pos, lstrip)
        return True

    def _step_close(self, final: bool) -> bool:
        p = skip_ws(self.buf, self.pos)
        r = expect(self.buf, p, self.CLOSE)
        if isinstance(r, int):
            self._end_call(r, lstrip=True)
        elif r is Scan.NEED:
            if not final:
                return False
            self._end_call(len(self.buf), lstrip=True)  # a close tag cut off by the stop
        else:
            self._end_call(p, lstrip=True)  # no close tag: what follows is text again
        return True

    def _step_whole(self, final: bool) -> bool:
        assert self._whole is not None
        close = self._whole.find(self.buf, self.CLOSE)
        if close is None and not final:
            return False
        end = len(self.buf) if close is None else close
        resume = end if close is None else close + len(self.CLOSE)
        call = parse_whole(self.buf[self._whole_start : end])
        if call is None:
            self._reject(resume)  # invalid JSON: the raw text, tags included, is content
            return True
        self._commit(call[0])
        for key, value in call[1].items():
            self._member(key, value)
        self._end_call(resume, lstrip=True)
        return True
