"""An XML tool call, byte by byte: what follows the block's opening tag up to its closing
tag (single tokens: `call_constraint.CallConstraint` handles them), in either spelling:

    Qwen3-Coder / Qwen3.5+ (`<tool_call>` … `</tool_call>`), one call:
        \\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n … </function>\\n
    MiniMax-M2 (`<minimax:tool_call>` … `</minimax:tool_call>`), one or more invokes:
        \\n<invoke name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n … </invoke>\\n<invoke …

NAME is one of the tools' names; each KEY one of that tool's parameters not written yet
(the parsers read them in any order), every required one before the call's closing tag;
each VALUE as `xml_value.ParamValue` matches it. Up to LEAD_SPACE whitespace bytes may
stand where the parsers skip whitespace: before the first call, between the tags, after a
call. With `one_call` (parallel calls off) a MiniMax block holds one invoke. A state is a
tuple whose first item says where the call is:

    (LEAD, n)  (OPEN, i)  (NAME, prefix)  (NAMED, tool, i)  (GAP, tool, seen, n)
    (TAG, tool, seen, text)  (KEY, tool, seen, prefix)  (KEYED, tool, seen, key, i)
    (VALUE, tool, seen, key, value)  (END, n)

`seen` is a bitmask of the tool's parameters written so far; `i` counts the bytes of a tag
written so far. The block is complete in END (after a call's closing tag).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgemoe.structured.constraint import LEAD_SPACE
from edgemoe.structured.xml_value import CLOSED, ParamValue

LEAD, OPEN, NAME, NAMED, GAP, TAG, KEY, KEYED, VALUE, END = range(10)
_SPACE = frozenset(b" \t\n\r")
MEMO_LIMIT = 1 << 16  # (state, byte) results kept before the memo starts over


@dataclass(frozen=True)
class XmlSpelling:
    """How a format writes a call inside its block. A name or key ends at `attr_close`, whose
    first byte `forbidden` keeps out of every name and key (so it ends one unambiguously)."""

    format: str  # the tool format's name, for messages
    call_open: bytes  # before the tool's name
    attr_close: bytes  # after a name or a key
    param_open: bytes  # before a key
    value_lead: bytes  # between a key's tag and its value
    call_close: bytes
    newline_close: bool  # a value closes at `\\n</parameter>` (else at `</parameter>`)
    repeats: bool  # a block holds several calls
    forbidden: str  # characters no name or key may hold (the parser would misread it)
    max_name: int | None = None  # the longest tool name its parser reads (characters; None: any)
    max_key: int | None = None  # the longest parameter key


QWEN3_CODER = XmlSpelling("qwen3_coder", b"<function=", b">", b"<parameter=", b"\n", b"</function>",
                          newline_close=True, repeats=False, forbidden="<>\n")
# NOTE: the limits are the minimax_m2 parser's MAX_NAME and MAX_KEY (a longer one is not read).
MINIMAX_M2 = XmlSpelling("minimax_m2", b'<invoke name="', b'">', b'<parameter name="', b"", b"</invoke>",
                         newline_close=False, repeats=True, forbidden="<>\"'\n", max_name=256, max_key=1024)
SPELLINGS = {s.format: s for s in (QWEN3_CODER, MINIMAX_M2)}


@dataclass(frozen=True)
class XmlTool:
    """One tool as its calls are held: its name, its parameters' keys and value matchers
    (in the schema's order), and the bitmask of the required ones."""

    name: bytes
    keys: tuple[bytes, ...]
    values: tuple[ParamValue, ...]
    required: int


class XmlCalls:
    """The matcher of a block of calls to any of `tools` in `spelling` (module doc);
    states are tuples. `one_call`: one call per block, where the spelling repeats them."""

    def __init__(self, tools: list[XmlTool], spelling: XmlSpelling = QWEN3_CODER, one_call: bool = False) -> None:
        if not tools:
            raise ValueError("no tools to call")
        if any(v.newline_close != spelling.newline_close for t in tools for v in t.values):
            raise ValueError(f"values built for another spelling than {spelling.format}'s")
        self.tools = tools
        self.spelling = spelling
        self._repeats = spelling.repeats and not one_call
        self._attr_end = spelling.attr_close[0]
        self._key_tail = spelling.attr_close + spelling.value_lead  # from the key's end to its value
        self._names = _prefixes([t.name for t in tools])
        self._keys = [_prefixes(t.keys) for t in tools]
        self._memo: dict[tuple, dict[int, tuple | None]] = {}
        self._entries = 0

    def start(self) -> tuple:
        return (LEAD, 0)

    def is_complete(self, state: tuple) -> bool:
        return state[0] == END

    def advance(self, state: tuple, byte: int) -> tuple | None:
        """The state after `byte`, or None where it is refused (memoised per state)."""
        row = self._memo.get(state)
        if row is None:
            if self._entries > MEMO_LIMIT:
                self._memo, self._entries = {}, 0
            row = self._memo[state] = {}
        elif byte in row:
            return row[byte]
        self._entries += 1
        row[byte] = got = self._step(state, byte)
        return got

    def advance_bytes(self, state: tuple | None, data: bytes) -> tuple | None:
        """The state after all of `data`, or None as soon as one byte is refused."""
        for byte in data:
            if state is None:
                return None
            state = self.advance(state, byte)
        return state

    def _step(self, state: tuple, byte: int) -> tuple | None:
        kind, sp = state[0], self.spelling
        if kind == VALUE:
            return self._value(state, byte)
        if kind == LEAD:
            return _space(state, byte, 1) or ((OPEN, 1) if byte == sp.call_open[0] else None)
        if kind == OPEN:
            i = state[1]
            if byte != sp.call_open[i]:
                return None
            return (NAME, b"") if i + 1 == len(sp.call_open) else (OPEN, i + 1)
        if kind == NAME:
            return self._name(state[1], byte)
        if kind == NAMED:
            return self._named(state, byte)
        if kind == GAP:
            return _space(state, byte, 3) or self._tag(state[1], state[2], b"", byte)
        if kind == TAG:
            return self._tag(state[1], state[2], state[3], byte)
        if kind == KEY:
            return self._key(state, byte)
        if kind == KEYED:
            return self._keyed(state, byte)
        if kind == END:
            return _space(state, byte, 1) or ((OPEN, 1) if self._repeats and byte == sp.call_open[0] else None)
        raise ValueError(f"not a call state: {state!r}")

    def _name(self, prefix: bytes, byte: int) -> tuple | None:
        if byte == self._attr_end:
            tools = self._names.get(prefix)
            if tools is None or tools[1] is None:
                return None
            return self._named((NAMED, tools[1], 0), byte)
        longer = prefix + bytes((byte,))
        return (NAME, longer) if longer in self._names else None

    def _named(self, state: tuple, byte: int) -> tuple | None:
        """The name's closing bytes (`>`, `">`), then the gap before the first parameter."""
        _, tool, i = state
        close = self.spelling.attr_close
        if byte != close[i]:
            return None
        return (GAP, tool, 0, 0) if i + 1 == len(close) else (NAMED, tool, i + 1)

    def _tag(self, tool: int, seen: int, text: bytes, byte: int) -> tuple | None:
        """A parameter's opening tag while one is left to write, the call's closing tag once
        the required ones are written."""
        text += bytes((byte,))
        t, sp = self.tools[tool], self.spelling
        if sp.param_open.startswith(text) and seen != (1 << len(t.keys)) - 1:
            return (KEY, tool, seen, b"") if text == sp.param_open else (TAG, tool, seen, text)
        if sp.call_close.startswith(text) and t.required & ~seen == 0:
            return (END, 0) if text == sp.call_close else (TAG, tool, seen, text)
        return None

    def _key(self, state: tuple, byte: int) -> tuple | None:
        _, tool, seen, prefix = state
        keys = self._keys[tool]
        if byte == self._attr_end:
            got = keys.get(prefix)
            key = got[1] if got is not None else None
            if key is None or seen >> key & 1:
                return None
            return self._keyed((KEYED, tool, seen | 1 << key, key, 0), byte)
        longer = prefix + bytes((byte,))
        got = keys.get(longer)
        return (KEY, tool, seen, longer) if got is not None and got[0] & ~seen else None

    def _keyed(self, state: tuple, byte: int) -> tuple | None:
        """The key's closing bytes and what the template writes before a value (`>\\n`, `">`)."""
        _, tool, seen, key, i = state
        if byte != self._key_tail[i]:
            return None
        if i + 1 < len(self._key_tail):
            return (KEYED, tool, seen, key, i + 1)
        return (VALUE, tool, seen, key, self.tools[tool].values[key].start())

    def _value(self, state: tuple, byte: int) -> tuple | None:
        _, tool, seen, key, value = state
        nxt = self.tools[tool].values[key].advance(value, byte)
        if nxt is None:
            return None
        return (GAP, tool, seen, 0) if nxt is CLOSED else (VALUE, tool, seen, key, nxt)

    # What the token-mask walk asks (token_masks.ByteGrammar): only a value has strings.
    def _param(self, state: tuple) -> ParamValue | None:
        return self.tools[state[1]].values[state[3]] if state[0] == VALUE else None

    def free_string(self, state: tuple) -> bool:
        param = self._param(state)
        return param is not None and param.free_string(state[4])

    def string_room(self, state: tuple) -> int | None:
        param = self._param(state)
        return None if param is None else param.string_room(state[4])

    def free_table(self, state: tuple) -> bytes:
        param = self._param(state)
        assert param is not None
        return param.free_bytes

    def split(self, state: tuple) -> list[tuple]:
        param = self._param(state)
        if param is None:
            return [state]
        return [(*state[:4], part) for part in param.split(state[4])]


def _space(state: tuple, byte: int, at: int) -> tuple | None:
    """The whitespace count at `state[at]` moved on by `byte`, if it is whitespace and room is left."""
    if byte in _SPACE and state[at] < LEAD_SPACE:
        return (*state[:at], state[at] + 1)
    return None


def _prefixes(words: tuple[bytes, ...] | list[bytes]) -> dict[bytes, tuple[int, int | None]]:
    """Every prefix of `words` -> (bitmask of the words it begins, the index of the word it is
    or None)."""
    out: dict[bytes, tuple[int, int | None]] = {}
    for i, word in enumerate(words):
        for n in range(len(word) + 1):
            mask, whole = out.get(word[:n], (0, None))
            out[word[:n]] = (mask | 1 << i, i if n == len(word) else whole)
    return out
