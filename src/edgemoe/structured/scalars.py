"""Runtime leaves for JSON scalars (strings, numbers, literal sets) and the shared byte tables.

A matcher *thread* is `(frame, parents)`: the construct being read and the frozenset of
threads that resume once it ends (a graph-structured stack, as in GLR parsing: anyOf
alternatives that nest the same way share one top frame with the union of their parents,
so ambiguity costs a set per level, not a thread per combination). A *frame* is a tuple
whose first item is the leaf that interprets it, so a step is `frame[0].step(thread,
byte)`, returning the threads that follow (none: refused). Tuples and frozensets keep
threads hashable and cheap to compare: a frozenset caches its hash, and parents are
shared, so a comparison usually stops at an identical (`is`) parent set.

Frames are canonical on purpose: two threads that mean the same position are equal. An
unconstrained string body is always the one `FREE_BODY` frame, whatever was read inside it
(the token-mask fast path depends on that); a string with minLength only stops counting
at minLength.
"""

from __future__ import annotations

from typing import Iterable

Thread = tuple  # (frame, Parents | None)
Parents = frozenset  # frozenset[Thread]: where a value's reader goes once it ends
Frame = tuple  # (leaf, *data)

MAX_WS = 32  # whitespace bytes per gap between tokens: a random model cannot loop in it
# Objects/arrays nested in one another at most (serde_json's default limit). It keeps any
# value and recursive schemas finite, and state comparisons (which recurse once per
# level) far from Python's recursion limit.
MAX_NESTING = 128
MAX_INT_DIGITS = 20
MAX_FRAC_DIGITS = 20
# Two exponent digits keep every number a finite double (|x| < 1e120): with three, "1e999"
# parses as Infinity in Python and is refused by strict parsers (serde_json).
MAX_EXP_DIGITS = 2

UNBOUNDED_ROOM = 1 << 30  # string_room() of a string with no maxLength

QUOTE, BACKSLASH, MINUS, PLUS, DOT, ZERO = 0x22, 0x5C, 0x2D, 0x2B, 0x2E, 0x30
COMMA, COLON, LBRACE, RBRACE, LBRACKET, RBRACKET = 0x2C, 0x3A, 0x7B, 0x7D, 0x5B, 0x5D
IS_WS: tuple[bool, ...] = tuple(b in b" \t\n\r" for b in range(256))
IS_DIGIT: tuple[bool, ...] = tuple(0x30 <= b <= 0x39 for b in range(256))
FREE_STRING_BYTES: frozenset[int] = frozenset(range(0x20, 0x100)) - {QUOTE, BACKSLASH}

# String sub-modes (0 = plain body). 1..12: inside an escape; \uD800-\uDBFF must be followed
# by a \uDC00-\uDFFF escape and a lone low surrogate is refused, so every escape decodes to
# exactly one code point (strict parsers refuse lone surrogates; counts stay exact).
E_BS, E_U1, E_R3, E_R2, E_R1, E_UD, E_H2, E_H1, E_HBS, E_HU, E_LD, E_LC = range(1, 13)
# 20..26: inside a UTF-8 sequence (validated only in length-constrained strings, so that a
# character count is a code point count: the detokenizer turns broken bytes into U+FFFD).
U_C1, U_C2, U_C3, U_E0, U_ED, U_F0, U_F4 = range(20, 27)


def _mode_table() -> tuple[dict[int, int], ...]:
    """Escape and UTF-8 continuation transitions: MODE_NEXT[mode][byte] -> next mode."""
    t: list[dict[int, int]] = [{} for _ in range(27)]
    hexd = b"0123456789abcdefABCDEF"
    t[E_BS] = {b: 0 for b in b'"\\/bfnrt'} | {ord("u"): E_U1}
    t[E_U1] = {b: (E_UD if b in b"dD" else E_R3) for b in hexd}
    t[E_R3] = dict.fromkeys(hexd, E_R2)
    t[E_R2] = dict.fromkeys(hexd, E_R1)
    t[E_R1] = dict.fromkeys(hexd, 0)
    t[E_UD] = dict.fromkeys(b"01234567", E_R2) | dict.fromkeys(b"89abAB", E_H2)
    t[E_H2] = dict.fromkeys(hexd, E_H1)
    t[E_H1] = dict.fromkeys(hexd, E_HBS)
    t[E_HBS] = {BACKSLASH: E_HU}
    t[E_HU] = {ord("u"): E_LD}
    t[E_LD] = dict.fromkeys(b"dD", E_LC)
    t[E_LC] = dict.fromkeys(b"cdefCDEF", E_R2)
    cont = range(0x80, 0xC0)
    t[U_C1] = dict.fromkeys(cont, 0)
    t[U_C2] = dict.fromkeys(cont, U_C1)
    t[U_C3] = dict.fromkeys(cont, U_C2)
    t[U_E0] = dict.fromkeys(range(0xA0, 0xC0), U_C1)
    t[U_ED] = dict.fromkeys(range(0x80, 0xA0), U_C1)
    t[U_F0] = dict.fromkeys(range(0x90, 0xC0), U_C2)
    t[U_F4] = dict.fromkeys(range(0x80, 0x90), U_C2)
    return tuple(t)


MODE_NEXT = _mode_table()
# UTF-8 lead byte -> mode (0: not a valid lead; 0x80-0xC1 and 0xF5-0xFF never start a char)
UTF8_LEAD: tuple[int, ...] = tuple(
    U_C1 if 0xC2 <= b <= 0xDF else U_E0 if b == 0xE0 else U_ED if b == 0xED
    else U_C2 if 0xE1 <= b <= 0xEF else U_F0 if b == 0xF0 else U_C3 if 0xF1 <= b <= 0xF3
    else U_F4 if b == 0xF4 else 0
    for b in range(256)
)


class Leaf:
    """One kind of JSON value a slot may hold; it also interprets the frames it pushes.
    `md` is the least nesting its values add (0 for scalars): a leaf starts only where
    that still fits under MAX_NESTING, so no state is left that nothing can finish."""

    __slots__ = ()
    md = 0

    def first_bytes(self) -> Iterable[int]:
        """Bytes that can start this value (the slot's dispatch table is built from them)."""
        raise NotImplementedError

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        """Threads after the value's first byte; `parents` resume once the value is done;
        `depth` counts the objects/arrays around it."""
        raise NotImplementedError

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        """Threads after `byte` from `thread`, whose top frame is this leaf's."""
        raise NotImplementedError

    def can_end(self, frame: Frame) -> bool:
        """Whether the value may stop here (only numbers and literal prefixes end lazily)."""
        return False

    def more(self, frame: Frame) -> bool:
        """Whether the frame itself takes another byte (asked for a top-level value only)."""
        return True


def hand_on(parents: Parents, byte: int) -> list[Thread]:
    """A value that ends lazily (a number) gives the byte that cannot extend it to its parents."""
    out: list[Thread] = []
    for parent in parents:
        out.extend(parent[0][0].step(parent, byte))
    return out


class _Done(Leaf):
    """Below the top-level value: once it is complete nothing more is allowed (only EOS)."""

    __slots__ = ()

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        return ()


DONE_FRAME: Frame = (_Done(),)
DONE_THREAD: Thread = (DONE_FRAME, None)
DONE_PARENTS: Parents = frozenset({DONE_THREAD})  # the top-level value's parents


class FreeString(Leaf):
    """A string with no length bound: every body byte leaves the thread unchanged."""

    __slots__ = ()

    def first_bytes(self) -> Iterable[int]:
        return (QUOTE,)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return ((FREE_BODY, parents),)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        mode = thread[0][1]
        if mode == 0:
            if byte == QUOTE:
                return thread[1]
            if byte == BACKSLASH:
                return (((self, E_BS), thread[1]),)
            return (thread,) if byte >= 0x20 else ()
        nxt = MODE_NEXT[mode].get(byte)
        if nxt is None:
            return ()
        return ((FREE_BODY if nxt == 0 else (self, nxt), thread[1]),)


FREE = FreeString()
FREE_BODY: Frame = (FREE, 0)


class BoundedString(Leaf):
    """A string with minLength/maxLength: counts code points (escape = 1; UTF-8 validated
    throughout, so a count is exact and the bytes a state takes are exactly the valid UTF-8
    with few enough characters: see Grammar.string_room). Frames: (leaf, count, mode);
    without maxLength the count stops at minLength, past which all counts mean the same."""

    __slots__ = ("lo", "hi")

    def __init__(self, lo: int, hi: int | None) -> None:
        self.lo, self.hi = lo, hi

    def first_bytes(self) -> Iterable[int]:
        return (QUOTE,)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return self._at(0, 0, parents)

    def _at(self, count: int, mode: int, parents: Parents) -> Iterable[Thread]:
        """The canonical thread (the count saturated at minLength when there is no maxLength)."""
        if self.hi is None and count > self.lo:
            count = self.lo
        return (((self, count, mode), parents),)

    def room(self, frame: Frame) -> int | None:
        """Characters still allowed at a character boundary (None: mid-character or escape)."""
        if frame[2]:
            return None
        return UNBOUNDED_ROOM if self.hi is None else self.hi - frame[1]

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        _, count, mode = thread[0]
        if mode:
            nxt = MODE_NEXT[mode].get(byte)
            return () if nxt is None else self._at(count, nxt, thread[1])
        if byte == QUOTE:
            return thread[1] if count >= self.lo else ()
        if byte < 0x20 or (self.hi is not None and count >= self.hi):
            return ()
        if byte < 0x80:
            return self._at(count + 1, E_BS if byte == BACKSLASH else 0, thread[1])
        lead = UTF8_LEAD[byte]
        return self._at(count + 1, lead, thread[1]) if lead else ()


class Number(Leaf):
    """`-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?` with capped digit runs; integers
    stop before the fraction. It ends lazily: a byte that cannot extend it goes to the parent."""

    __slots__ = ("integer",)
    SIGN, ZERO_, INT, DOT_, FRAC, E, ESIGN, EXP = range(8)
    _ENDS = (False, True, True, False, True, False, False, True)

    def __init__(self, integer: bool) -> None:
        self.integer = integer

    def first_bytes(self) -> Iterable[int]:
        return (MINUS, *range(0x30, 0x3A))

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        if byte == MINUS:
            return (((self, self.SIGN, 0), parents),)
        return (((self, self.ZERO_ if byte == ZERO else self.INT, 1), parents),)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        _, phase, n = thread[0]
        parents = thread[1]
        digit = IS_DIGIT[byte]
        if phase == self.SIGN:
            if not digit:
                return ()
            return (((self, self.ZERO_ if byte == ZERO else self.INT, 1), parents),)
        if phase == self.INT and digit and n < MAX_INT_DIGITS:
            return (((self, self.INT, n + 1), parents),)
        if phase == self.FRAC and digit and n < MAX_FRAC_DIGITS:
            return (((self, self.FRAC, n + 1), parents),)
        if phase == self.EXP and digit and n < MAX_EXP_DIGITS:
            return (((self, self.EXP, n + 1), parents),)
        if phase <= self.INT and not self.integer and byte == DOT:
            return (((self, self.DOT_, 0), parents),)
        if phase in (self.ZERO_, self.INT, self.FRAC) and not self.integer and byte in (0x65, 0x45):
            return (((self, self.E, 0), parents),)
        if phase == self.DOT_:
            return (((self, self.FRAC, 1), parents),) if digit else ()
        if phase == self.E and byte in (PLUS, MINUS):
            return (((self, self.ESIGN, 0), parents),)
        if phase in (self.E, self.ESIGN):
            return (((self, self.EXP, 1), parents),) if digit else ()
        return hand_on(parents, byte) if self._ENDS[phase] else ()

    def can_end(self, frame: Frame) -> bool:
        return self._ENDS[frame[1]]

    def more(self, frame: Frame) -> bool:
        phase, n = frame[1], frame[2]
        if phase == self.ZERO_:
            return not self.integer
        if phase == self.INT:
            return n < MAX_INT_DIGITS or not self.integer
        if phase == self.EXP:
            return n < MAX_EXP_DIGITS
        return True


NUMBER = Number(integer=False)
INTEGER = Number(integer=True)


class Literals(Leaf):
    """A set of exact texts (enum/const values, true/false/null) as a byte trie. A literal
    that no other one extends ends at once; one that may go on (enum [1, 12]) ends lazily."""

    __slots__ = ("kids", "final")

    def __init__(self, texts: Iterable[bytes]) -> None:
        kids: list[dict[int, int]] = [{}]
        final = [False]
        for text in sorted(set(texts)):
            node = 0
            for b in text:
                nxt = kids[node].get(b)
                if nxt is None:
                    nxt = kids[node][b] = len(kids)
                    kids.append({})
                    final.append(False)
                node = nxt
            final[node] = True
        self.kids: tuple[dict[int, int], ...] = tuple(kids)
        self.final: tuple[bool, ...] = tuple(final)

    def first_bytes(self) -> Iterable[int]:
        return tuple(self.kids[0])

    def _enter(self, node: int, parents: Parents) -> Iterable[Thread]:
        """The thread at trie node `node`: straight back to the parents at a closed literal."""
        if self.final[node] and not self.kids[node]:
            return parents
        return (((self, node), parents),)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return self._enter(self.kids[0][byte], parents)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        node = thread[0][1]
        nxt = self.kids[node].get(byte)
        out = () if nxt is None else self._enter(nxt, thread[1])
        if self.final[node]:
            return (*out, *hand_on(thread[1], byte))
        return out

    def can_end(self, frame: Frame) -> bool:
        return self.final[frame[1]]

    def more(self, frame: Frame) -> bool:
        return bool(self.kids[frame[1]])
