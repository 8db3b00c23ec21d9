"""One parameter's value in an XML tool call (Qwen3-Coder's, MiniMax-M2's), byte by byte.

Qwen3-Coder's template writes `<parameter=KEY>` `\\n` VALUE `\\n</parameter>`; the parser
strips one newline on each side of a string and all whitespace around any other value, so
there the value closes at `\\n</parameter>` (`newline_close`). MiniMax-M2's writes
`<parameter name="KEY">VALUE</parameter>` and its parser keeps a string verbatim: the value
closes at `</parameter>` and a newline is content like any byte. A value is
either raw text (a string parameter: the text is the string, as is) or JSON text (any
other type), and here it is matched by a JSON `Grammar` of the parameter's schema:

- raw: each byte goes to the grammar as the JSON string's content would carry it (`"`,
  `\\` and control bytes escaped), from the state after the opening `"`; the value may
  end where the grammar would take the closing `"` and be complete;
- JSON: bytes go to the grammar as they are; the value may end where it is complete.

The value ends at its closing tag, and never holds `</parameter>` otherwise: the parser
takes the first `</parameter>` followed by the next tag as the end, so a value holding one
could be cut short. While the text ends with a prefix of `\\n</parameter>` (or of
`</parameter>`), those bytes are held back from the grammar: they close the value if the
prefix completes, else they were content and are fed then. A held prefix is only allowed
where one of the two stays possible, so no state is a dead end.

A state is (inner, newline held, bytes of `</parameter>` held); `CLOSED` once the value ended.
"""

from __future__ import annotations

from edgemoe.structured.matcher import Grammar, State
from edgemoe.structured.vocab import FREE_BYTE

CLOSE = b"</parameter>"
NEWLINE = 0x0A
QUOTE = 0x22
CLOSED = ("closed",)
# Bytes that keep a value in a free string where it is: a raw string's every byte but the
# newline and `<` (either may begin the closing tag); in JSON a free string's but `<`.
RAW_FREE = bytes(b not in (NEWLINE, CLOSE[0]) for b in range(256))
RAW_FREE_BARE = bytes(b != CLOSE[0] for b in range(256))  # a raw string closed by `</parameter>` alone
JSON_FREE = bytes(f and b != CLOSE[0] for b, f in enumerate(FREE_BYTE))
_SHORT = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
ESCAPED = [_SHORT.get(b, b"\\u%04x" % b if b < 0x20 else bytes([b])) for b in range(256)]

ValueState = tuple


class ParamValue:
    """The matcher of one parameter's value (module doc): `raw` text or JSON, by `grammar`;
    `newline_close`: it closes at `\\n</parameter>` (Qwen3-Coder), else at `</parameter>`."""

    __slots__ = ("grammar", "raw", "newline_close", "_start", "free_bytes")

    def __init__(self, grammar: Grammar, raw: bool, newline_close: bool = True) -> None:
        self.grammar, self.raw, self.newline_close = grammar, raw, newline_close
        start = grammar.advance(grammar.start(), QUOTE) if raw else grammar.start()
        if start is None:
            raise ValueError("a raw value's grammar takes no string")
        self._start: State = start
        self.free_bytes = (RAW_FREE if newline_close else RAW_FREE_BARE) if raw else JSON_FREE

    def start(self) -> ValueState:
        return (self._start, False, 0)

    def advance(self, state: ValueState, byte: int) -> ValueState | None:
        """The state after `byte`: CLOSED where it completed the closing tag; None if refused."""
        inner, newline, held = state
        if byte == CLOSE[held]:
            if held + 1 == len(CLOSE):
                return CLOSED if self._closes(inner, newline) else None
            return self._holding(inner, newline, held + 1)
        inner = self._feed(inner, (b"\n" if newline else b"") + CLOSE[:held])
        if inner is None:
            return None
        if byte == NEWLINE and self.newline_close:
            return self._holding(inner, True, 0)
        if byte == CLOSE[0]:
            return self._holding(inner, False, 1)
        inner = self._feed(inner, bytes((byte,)))
        return None if inner is None else (inner, False, 0)

    def _holding(self, inner: State, newline: bool, held: int) -> ValueState | None:
        """A held prefix, where the value may still close or the bytes be content that can
        go on (not only as the rest of `</parameter>`, which content may not hold: an
        enum member "a</parameter>b" would leave no byte)."""
        if self._closes(inner, newline):
            return (inner, newline, held)
        content = self._feed(inner, (b"\n" if newline else b"") + CLOSE[:held])
        return None if content is None or not self._escapes(content, held) else (inner, newline, held)

    def _closes(self, inner: State, newline: bool) -> bool:
        """Whether the closing tag may end the value here (after the newline it needs, if any)."""
        return (newline or not self.newline_close) and self.can_end(inner)

    def _escapes(self, content: State | None, held: int) -> bool:
        """Whether content that ends with `CLOSE[:held]` can take a byte that leaves the tag."""
        while content is not None and held < len(CLOSE):
            if any(b != CLOSE[held] and self._feed(content, bytes((b,))) is not None for b in range(256)):
                return True
            content, held = self._feed(content, CLOSE[held:held + 1]), held + 1
        return False

    def _feed(self, inner: State | None, data: bytes) -> State | None:
        g = self.grammar
        for byte in data:
            if inner is None:
                return None
            if self.raw:
                inner = g.advance_bytes(inner, ESCAPED[byte])
            else:
                inner = g.advance(inner, byte)
        return inner

    def can_end(self, inner: State) -> bool:
        """Whether the value's text may end here."""
        if self.raw:
            inner = self.grammar.advance(inner, QUOTE)  # type: ignore[assignment]
            return inner is not None and self.grammar.is_complete(inner)
        return self.grammar.is_complete(inner)

    # What the token-mask walk asks (token_masks.ByteGrammar); nothing is held in these.
    def free_string(self, state: ValueState) -> bool:
        return not state[1] and not state[2] and self.grammar.free_string(state[0])

    def string_room(self, state: ValueState) -> int | None:
        return None if state[1] or state[2] else self.grammar.string_room(state[0])

    def split(self, state: ValueState) -> list[ValueState]:
        if state[1] or state[2]:
            return [state]
        return [(part, False, 0) for part in self.grammar.split(state[0])]
