"""What the formats whose calls are key / raw-value pairs share (qwen3_coder's
`<parameter=KEY>VALUE</parameter>`, glm45's `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>`,
minimax_m2's `<parameter name="KEY">VALUE</parameter>`): each value typed by the called
tool's schema, the step between pairs, and the search for the closing tag that really
ends a value (a value may hold the tag itself)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum

from edgemoe.server.parsers.base import IdFactory, Scan, TaggedToolParser, ToolSpec, expect, skip_ws
from edgemoe.tool_values import SchemaResolver, convert_typed, tool_schemas


MAX_KEY = 1024  # longer is no parameter's name; bounds the rescans of an unclosed key


def expect_any(buf: str, pos: int, tags: tuple[str, ...]) -> int | Scan:
    """Position after the first of `tags` at `pos`; NEED if one may still start there."""
    results = [expect(buf, pos, tag) for tag in tags]
    hit = next((r for r in results if isinstance(r, int)), None)
    if hit is not None:
        return hit
    return Scan.NEED if Scan.NEED in results else Scan.FAIL


def followed_by(buf: str, pos: int, tags: tuple[str, ...]) -> bool | Scan:
    """Whether one of `tags` follows `pos` after optional whitespace (NEED: one may still)."""
    r = expect_any(buf, skip_ws(buf, pos), tags)
    return Scan.NEED if r is Scan.NEED else isinstance(r, int)


def value_ends(buf: str, pos: int, pair_open: str, call_close: str,
               call_closes: Callable[[str, int], bool | Scan]) -> bool | Scan:
    """Is the value's closing tag ending at `pos` the real end of its value? It is when the
    next pair's `pair_open` follows (after whitespace), or `call_close` that `call_closes`
    (given the buffer and the end of `call_close`) says really closes the call."""
    p = skip_ws(buf, pos)
    nxt = expect(buf, p, pair_open)
    if isinstance(nxt, int):
        return True
    end = expect(buf, p, call_close)
    if isinstance(end, int):
        return call_closes(buf, end)
    return Scan.NEED if Scan.NEED in (nxt, end) else False


class Phase(Enum):
    HEADER = "header"  # expecting the call's name
    BODY = "body"  # committed: expecting a pair or the call's close
    VALUE = "value"  # inside a value


class KeyedValuesParser(TaggedToolParser):
    """A `TaggedToolParser` whose calls go HEADER → (BODY ↔ VALUE): the subclass gives
    `_header` (the name and where the body starts), `_pair_head` (a pair's key and where
    its value starts), `_body_close` (where the call's closing tags end), `VALUE_TAG` and
    `_value_closes`; `_leave_body` says what a closed body leaves (the call, by default).
    `self._scan_from`: no real closing tag of the value starts before it."""

    def __init__(self, tools: Sequence[ToolSpec] | None = None, id_factory: IdFactory | None = None) -> None:
        super().__init__(tools, id_factory)
        self._schemas = tool_schemas(self.tools)
        self._resolvers: dict[str, SchemaResolver] = {}  # per called tool, made on first use
        self._begin_call()

    def _begin_call(self) -> None:
        self._phase = Phase.HEADER
        self._name = ""
        self._key = ""  # the pair being read
        self._pair_start = 0  # where its key's tag began: given back if the pair is cut off
        self._value_start = 0
        self._scan_from = 0  # no real closing tag of the value starts before this

    def _header(self) -> tuple[str, int] | Scan:
        """The call's name and where its body starts; NEED / FAIL as `Scan` says."""
        raise NotImplementedError

    def _pair_head(self, pos: int) -> tuple[str, int] | Scan:
        """The key of the pair opening at `pos` and where its value starts; NEED / FAIL."""
        raise NotImplementedError

    def _body_close(self, pos: int) -> int | Scan:
        """Where the closing tags of the body at `pos` end; NEED / FAIL as `Scan` says."""
        raise NotImplementedError

    def _leave_body(self, end: int) -> None:
        """The body closed with tags ending at `end`: by default the call ends there."""
        self._end_call(end, lstrip=True)

    def _step_body(self, final: bool) -> bool:
        buf = self.buf
        p = skip_ws(buf, self.pos)
        head = self._pair_head(p)
        if isinstance(head, tuple):
            self._key, self._pair_start = head[0], p
            self.pos = self._value_start = self._scan_from = head[1]
            self._phase = Phase.VALUE
            return True
        close = self._body_close(p)
        if isinstance(close, int):
            self._leave_body(close)
            return True
        if Scan.NEED in (head, close) and not final:
            return False
        if p == len(buf) or (close is Scan.NEED and head is Scan.FAIL):
            self._end_call(len(buf), lstrip=True)  # the stop cut the closing tags
        elif self._length_cut(Scan.NEED in (head, close)):
            self._drop_tail()  # the length limit cut a pair's tag: no markup as content
        else:
            self._end_call(p, lstrip=False)  # not the format (or the model ended in a pair's tag): the rest is text
        return True

    VALUE_TAG = ""  # the tag that ends a value (a format may hold it inside one too)

    def _value_closes(self, buf: str, end: int) -> bool | Scan:
        """Whether the `VALUE_TAG` ending at `end` really ends its value (NEED: not yet known)."""
        raise NotImplementedError

    def _raw_value(self, text: str) -> str:
        """A value's text as the tool's schema types it (a format may strip its framing)."""
        return text

    def _step_value(self, final: bool) -> bool:
        end = self._find_close(self.VALUE_TAG, self._value_closes, final)
        if end is Scan.NEED:
            return False
        if end is Scan.FAIL:  # the output ended inside the value
            if self.cut_by_length:
                self._drop_tail()  # by the length limit: a value cut short is no value, nor content
            else:
                self._end_call(self._pair_start, lstrip=False)  # by the model (EOS, a stop): the pair is text
            return True
        assert isinstance(end, int)
        self._typed_member(self._key, self._raw_value(self.buf[self._value_start : end]))
        self.pos, self._phase = end + len(self.VALUE_TAG), Phase.BODY
        return True

    def _step_call(self, final: bool) -> bool:
        if self._phase is Phase.HEADER:
            return self._step_header(final)
        if self._phase is Phase.BODY:
            return self._step_body(final)
        return self._step_value(final)

    def _step_header(self, final: bool) -> bool:
        named = self._header()
        if isinstance(named, tuple):
            self._name = named[0]
            self._commit(named[0])
            self.pos, self._phase = named[1], Phase.BODY
            return True
        if named is Scan.NEED and not final:
            return False
        self._reject()  # prose mentioning the tag, or cut off before the name was certain
        return True

    def _typed_member(self, key: str, raw: str) -> None:
        """The pair `key`: `raw` as the called tool's schema types that parameter."""
        resolver = self._resolvers.get(self._name)
        if resolver is None:
            resolver = self._resolvers[self._name] = SchemaResolver(self._schemas.get(self._name))
        self._member(key, convert_typed(raw, resolver.property_type(key)))

    def _find_close(self, tag: str, closes: Callable[[str, int], bool | Scan], final: bool) -> int | Scan:
        """Start of the first `tag` from `self._scan_from` that `closes` (given the buffer and
        the tag's end) says really ends the value; NEED until that is certain, FAIL when the
        output ended without one (`final`). A tag whose lookahead the end cut off closes the
        value when the model ended there; not when the length limit did (`cut_by_length`):
        it may be a literal tag inside a value that goes on, and a value cut short must not
        read as whole."""
        buf, start = self.buf, self._scan_from
        while True:
            i = buf.find(tag, start)
            if i < 0:
                if final:
                    return Scan.FAIL
                self._scan_from = max(start, len(buf) - len(tag) + 1)  # a tag split by the chunking starts here
                return Scan.NEED
            ends = closes(buf, i + len(tag))
            if ends is True or (ends is Scan.NEED and final and not self.cut_by_length):
                return i
            if ends is Scan.NEED and not final:
                self._scan_from = i
                return Scan.NEED
            start = i + 1
