"""Grammar: a byte-level incremental matcher for "JSON text matching a schema".

A state is a frozenset of threads (scalars.py): one per top frame the bytes read so far
can be continued from (anyOf alternatives that started alike, a number that may end or go
on); threads with the same top frame are merged into one with the union of their parent
sets, so nested ambiguity grows a set per level instead of a thread per combination. A
frozenset is immutable, caches its hash, and compares element by element with identity
short-cuts, so states make good cache keys; equal positions give equal states (see the
canonical frames in scalars.py/nodes.py), and `advance` interns its results, so repeated
positions are the very same object.

Merged parent sets are interned for the grammar's life (the result memo and state table
start over now and then): a merged set is where the stack graph shares structure, and
two equal but distinct copies of such sets, nested, would make an equality test walk
every path through the graph (exponential in depth). With them unique, comparing two
states costs at most their depth (MAX_NESTING) per thread.

JSON text rules (RFC 8259): no whitespace before the top-level value or after it; at most
MAX_WS (32) whitespace bytes in any gap between tokens; string bytes < 0x20 refused; the
escapes \\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX (either case), where a \\uD800-\\uDBFF escape must be
followed by a \\uDC00-\\uDFFF one and a lone low surrogate is refused; bytes >= 0x80 are
allowed in strings without UTF-8 checks (the detokenizer replaces a broken sequence by
U+FFFD, still valid JSON) except in strings with minLength/maxLength, where sequences are
validated (overlong forms and surrogates refused too) so that lengths count code points
(an escape counts one). Numbers: at most 20 integer digits, 20 fraction digits and 2
exponent digits (always a finite double). Objects and arrays nest at most MAX_NESTING
(128) deep, also for any-value slots ({} / true / json_object), with no dead end: near
the limit only values that still fit are offered.
"""

from __future__ import annotations

from edgemoe.structured.errors import GrammarError
from edgemoe.structured.nodes import ANY_OBJECT, RootLeaf, Slot
from edgemoe.structured.pattern_string import pattern_budget
from edgemoe.structured.scalars import (
    DONE_FRAME, DONE_THREAD, FREE_BODY, FREE_STRING_BYTES, UNBOUNDED_ROOM, BoundedString, Thread,
)
from edgemoe.structured.schema import compile_schema

State = frozenset  # frozenset[Thread]; opaque to callers
_MISS = object()
MEMO_LIMIT = 1 << 16  # (state, byte) results kept before the memo starts over (~4 MB)


class Grammar:
    """The matcher for one schema. Immutable apart from its result memo (thread-safe under
    the GIL: a race at worst computes a result twice)."""

    __slots__ = ("_start", "_memo", "_intern", "_unions", "_entries")

    def __init__(self, root: Slot) -> None:
        self._start: State = frozenset({((RootLeaf(root),), None)})
        self._memo: dict[State, dict[int, State | None]] = {}
        self._intern: dict[State, State] = {}
        self._unions: dict[frozenset, frozenset] = {}  # never cleared: see the module doc
        self._entries = 0

    @classmethod
    def from_schema(cls, schema: object) -> "Grammar":
        """A JSON Schema (dict, or True for any value); raises GrammarError."""
        with pattern_budget():  # a schema's patterns share one bound on the work they take
            try:
                return cls(compile_schema(schema))
            except ArithmeticError as exc:  # a number no double holds, met where none was expected: a 400, not a 500
                raise GrammarError("", f"a number in the schema is out of range ({exc})") from exc

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's {"type": "json_object"})."""
        slot = Slot()
        slot.set_leaves([ANY_OBJECT])
        return cls(slot)

    def start(self) -> State:
        """The state before any byte."""
        return self._start

    def advance(self, state: State, byte: int) -> State | None:
        """The state after `byte` (0..255), or None if the byte is not allowed here."""
        row = self._memo.get(state)
        if row is None:
            row = self._memo[state] = {}
        else:
            got = row.get(byte, _MISS)
            if got is not _MISS:
                return got  # type: ignore[return-value]
        result = self._compute(state, byte)
        self._entries += 1
        if self._entries > MEMO_LIMIT:
            self._memo, self._intern, self._entries = {}, {}, 0
        row[byte] = result
        return result

    def _compute(self, state: State, byte: int) -> State | None:
        """Step every thread; the union of what survives, merged by top frame, interned."""
        if not 0 <= byte < 256:
            raise ValueError(f"not a byte: {byte!r}")
        out: set[Thread] = set()
        for thread in state:
            out.update(thread[0][0].step(thread, byte))
        if not out:
            return None
        if len(out) > 1:
            out = self._merge(out)
        new = frozenset(out)
        self._intern.setdefault(state, state)  # a fixed point (free string) returns `state` itself
        return self._intern.setdefault(new, new)

    def _merge(self, threads: set[Thread]) -> set[Thread]:
        """One thread per top frame, its parents the union of theirs (a GLR-style merge)."""
        by_frame: dict[tuple, list[Thread]] = {}
        for thread in threads:
            by_frame.setdefault(thread[0], []).append(thread)
        if len(by_frame) == len(threads):
            return threads
        merged: set[Thread] = set()
        for frame, group in by_frame.items():
            if len(group) == 1:
                merged.add(group[0])
                continue
            parents = frozenset().union(*(t[1] for t in group))
            merged.add((frame, self._unions.setdefault(parents, parents)))
        return merged

    def advance_bytes(self, state: State, data: bytes) -> State | None:
        """The state after all of `data`, or None as soon as one byte is refused."""
        for byte in data:
            state = self.advance(state, byte)  # type: ignore[assignment]
            if state is None:
                return None
        return state

    def is_complete(self, state: State) -> bool:
        """Whether a whole top-level value has been read: the output may end here."""
        for frame, parents in state:
            if frame is DONE_FRAME:
                return True
            if parents is not None and DONE_THREAD in parents and frame[0].can_end(frame):
                return True
        return False

    def can_continue(self, state: State) -> bool:
        """Whether some byte is still allowed (False only once a top-level value is closed:
        object, array, string, literal, or a number with no digit or part left to add)."""
        for frame, parents in state:
            if frame is DONE_FRAME:
                continue
            if parents is None or len(parents) > 1 or DONE_THREAD not in parents or frame[0].more(frame):
                return True
        return False

    def string_room(self, state: State) -> int | None:
        """For a state where every thread is inside a length-bounded string (minLength or
        maxLength) at a character boundary: the most characters it may still take, r
        (UNBOUNDED_ROOM, 2**30, without maxLength). Then a run of FREE_STRING_BYTES is
        accepted exactly when it is valid UTF-8 (or a valid prefix: scalars.MODE_NEXT and
        UTF8_LEAD say which) of at most r characters (ASCII and lead bytes). None for any
        other state."""
        room = -1
        for frame, _ in state:
            if type(frame[0]) is not BoundedString:
                return None
            got = frame[0].room(frame)
            if got is None:
                return None
            room = max(room, got)
        return room

    def split(self, state: State) -> list[State]:
        """`state` as the union of parts the token-mask walk covers fast: its free-string
        threads, its bounded-string threads at a character boundary, and the rest (only
        the non-empty ones; one part when there is nothing to split). A byte run is
        accepted from a state iff it is from one of its threads, so a token is allowed
        from `state` iff it is from one of the parts."""
        if len(state) < 2:
            return [state]
        free, bounded, rest = [], [], []
        for thread in state:
            frame = thread[0]
            if frame is FREE_BODY:
                free.append(thread)
            elif type(frame[0]) is BoundedString and frame[0].room(frame) is not None:
                bounded.append(thread)
            else:
                rest.append(thread)
        parts = [frozenset(p) for p in (free, bounded, rest) if p]
        return [state] if len(parts) == 1 else [self._intern.setdefault(p, p) for p in parts]

    def free_string(self, state: State) -> bool:
        """True iff every byte of FREE_STRING_BYTES maps `state` to an equal state: every
        thread is inside an unconstrained string body (no bound pending, no escape open)."""
        for thread in state:
            if thread[0] is not FREE_BODY:
                return False
        return True


__all__ = ["FREE_STRING_BYTES", "UNBOUNDED_ROOM", "Grammar", "State"]
