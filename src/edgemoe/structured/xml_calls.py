"""A Qwen3-Coder / Qwen3.5+ XML tool call, byte by byte: what follows `<tool_call>` up to
`</tool_call>` (the tags are single tokens: `call_constraint.CallConstraint` handles them).

    \\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n … </function>\\n

NAME is one of the tools' names; each KEY one of that tool's parameters not written yet
(the parser reads them in any order), every required one before `</function>`; each
VALUE as `xml_value.ParamValue` matches it. Up to LEAD_SPACE whitespace bytes may stand
where the parser skips whitespace: before `<function=`, between the tags, after
`</function>`. A state is a tuple whose first item says where the call is:

    (LEAD, n)  (OPEN, i)  (NAME, prefix)  (GAP, tool, seen, n)  (TAG, tool, seen, text)
    (KEY, tool, seen, prefix)  (LINE, tool, seen, key)  (VALUE, tool, seen, key, value)  (END, n)

`seen` is a bitmask of the tool's parameters written so far. The call is complete in END.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgemoe.structured.constraint import LEAD_SPACE
from edgemoe.structured.xml_value import CLOSED, NEWLINE, ParamValue

LEAD, OPEN, NAME, GAP, TAG, KEY, LINE, VALUE, END = range(9)
FUNCTION_OPEN = b"<function="
PARAM_OPEN = b"<parameter="
FUNCTION_CLOSE = b"</function>"
_SPACE = frozenset(b" \t\n\r")
_GT = 0x3E
MEMO_LIMIT = 1 << 16  # (state, byte) results kept before the memo starts over


@dataclass(frozen=True)
class XmlTool:
    """One tool as its calls are held: its name, its parameters' keys and value matchers
    (in the schema's order), and the bitmask of the required ones."""

    name: bytes
    keys: tuple[bytes, ...]
    values: tuple[ParamValue, ...]
    required: int


class XmlCalls:
    """The matcher of one call to any of `tools` (module doc); states are tuples."""

    def __init__(self, tools: list[XmlTool]) -> None:
        if not tools:
            raise ValueError("no tools to call")
        self.tools = tools
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
        kind = state[0]
        if kind == VALUE:
            return self._value(state, byte)
        if kind == LEAD:
            return _space(state, byte, 1) or ((OPEN, 1) if byte == FUNCTION_OPEN[0] else None)
        if kind == OPEN:
            i = state[1]
            if byte != FUNCTION_OPEN[i]:
                return None
            return (NAME, b"") if i + 1 == len(FUNCTION_OPEN) else (OPEN, i + 1)
        if kind == NAME:
            return self._name(state[1], byte)
        if kind == GAP:
            return _space(state, byte, 3) or self._tag(state[1], state[2], b"", byte)
        if kind == TAG:
            return self._tag(state[1], state[2], state[3], byte)
        if kind == KEY:
            return self._key(state, byte)
        if kind == LINE:
            if byte != NEWLINE:
                return None
            _, tool, seen, key = state
            return (VALUE, tool, seen, key, self.tools[tool].values[key].start())
        if kind == END:
            return _space(state, byte, 1)
        raise ValueError(f"not a call state: {state!r}")

    def _name(self, prefix: bytes, byte: int) -> tuple | None:
        if byte == _GT:
            tools = self._names.get(prefix)
            return (GAP, tools[1], 0, 0) if tools is not None and tools[1] is not None else None
        longer = prefix + bytes((byte,))
        return (NAME, longer) if longer in self._names else None

    def _tag(self, tool: int, seen: int, text: bytes, byte: int) -> tuple | None:
        """`<parameter=` while a parameter is left to write, `</function>` once the
        required ones are written."""
        text += bytes((byte,))
        t = self.tools[tool]
        if PARAM_OPEN.startswith(text) and seen != (1 << len(t.keys)) - 1:
            return (KEY, tool, seen, b"") if text == PARAM_OPEN else (TAG, tool, seen, text)
        if FUNCTION_CLOSE.startswith(text) and t.required & ~seen == 0:
            return (END, 0) if text == FUNCTION_CLOSE else (TAG, tool, seen, text)
        return None

    def _key(self, state: tuple, byte: int) -> tuple | None:
        _, tool, seen, prefix = state
        keys = self._keys[tool]
        if byte == _GT:
            got = keys.get(prefix)
            key = got[1] if got is not None else None
            return (LINE, tool, seen | 1 << key, key) if key is not None and not seen >> key & 1 else None
        longer = prefix + bytes((byte,))
        got = keys.get(longer)
        return (KEY, tool, seen, longer) if got is not None and got[0] & ~seen else None

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
