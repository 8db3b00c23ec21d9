"""A string held to `pattern` or to a known `format`: the pattern's NFA (regex.py)
determinised over the printable ASCII the string is written in, every state live.

A string with a pattern or format is written without escapes, in printable ASCII (no `"`
or `\\`): a subset of the valid instances, so every one the grammar writes matches. A
format is a pattern that only writes valid values (`date` days 01-28, e-mail and URI parts
of bounded length): `FORMATS`. Not enforced (as before): a pattern outside regex.py's
subset, or one no such string matches; an unknown format. Beside `minLength` /
`maxLength` both hold (`Paths`), unless the lengths make the pattern too costly to follow or
leave it no string: then the lengths alone do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

from edgemoe.structured.regex import ALPHABET, Nfa, Unsupported, build
from edgemoe.structured.scalars import QUOTE, Frame, Leaf, Parents, Thread

MAX_DFA = 4000  # states; past it the pattern is left unenforced
MAX_WORK = 600_000  # (NFA state, character) pairs visited while determinising: a hostile pattern's bound
MAX_PATH_WORK = 300_000  # DFA states x lengths x successors, for a pattern beside minLength / maxLength
SCHEMA_WORK = 3 * MAX_WORK  # one schema's patterns together (a schema may hold thousands): ~0.5 s
_budget: ContextVar[list[int] | None] = ContextVar("pattern_budget", default=None)


class OverBudget(Exception):
    """The schema's patterns used up its budget: this one is left unenforced (not cached:
    alone, in another schema, it may be enforced)."""


@contextmanager
def pattern_budget() -> Iterator[None]:
    """Bound the work of compiling one schema's patterns (`Grammar.from_schema`)."""
    token = _budget.set([SCHEMA_WORK])
    try:
        yield
    finally:
        _budget.reset(token)


def _charge(work: int, limit: int, what: str) -> None:
    """Count `work` against one pattern's `limit` (Unsupported: cached) and the schema's budget."""
    if work > limit:
        raise Unsupported(f"{what} too complex")
    budget = _budget.get()
    if budget is not None:
        if work > budget[0]:
            raise OverBudget(what)
        budget[0] -= work


_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])"
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
_HOST = r"([a-z0-9]{1,20}\.){1,3}[a-z]{2,6}"
FORMATS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "ipv4": r"^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$",
    "email": rf"^[a-z0-9]{{1,20}}([._+-][a-z0-9]{{1,20}}){{0,2}}@{_HOST}$",
    "uri": rf"^https?://{_HOST}(/[A-Za-z0-9._~-]{{1,20}}){{0,4}}/?$",
}


class Dfa:
    """`moves[s][byte]` -> state, only into states from which an accepting one is reachable."""

    def __init__(self, nfa: Nfa, start: int, accept: int) -> None:
        first = _closure(nfa, {start})
        index, sets = {first: 0}, [first]
        moves: list[dict[int, int]] = []
        i = work = 0
        while i < len(sets):
            row: dict[int, int] = {}
            step = sum(len(chars) for s in sets[i] for chars, _ in nfa.moves[s])
            _charge(step, MAX_WORK - work, "pattern")
            work += step
            for byte, targets in _step(nfa, sets[i]).items():
                nxt = _closure(nfa, targets)
                if nxt not in index:
                    if len(sets) >= MAX_DFA:
                        raise Unsupported(f"pattern too complex (over {MAX_DFA} states)")
                    index[nxt] = len(sets)
                    sets.append(nxt)
                row[byte] = index[nxt]
            moves.append(row)
            i += 1
        self.accepting = tuple(accept in s for s in sets)
        live = _live(moves, self.accepting)
        if not live[0]:
            raise Unsupported("no printable-ASCII string matches the pattern")
        self.moves = tuple({b: t for b, t in row.items() if live[t]} for row in moves)

    def matches(self, text: str) -> bool:
        state: int | None = 0
        for ch in text.encode():
            state = self.moves[state].get(ch) if state is not None else None
        return state is not None and self.accepting[state]


def _closure(nfa: Nfa, states: Iterable[int]) -> frozenset[int]:
    seen, todo = set(states), list(states)
    while todo:
        for t in nfa.eps[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return frozenset(seen)


def _step(nfa: Nfa, states: frozenset[int]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for s in states:
        for chars, target in nfa.moves[s]:
            for c in chars:
                out.setdefault(c, set()).add(target)
    return out


def _live(moves: list[dict[int, int]], accepting: tuple[bool, ...]) -> list[bool]:
    back: list[list[int]] = [[] for _ in moves]
    for s, row in enumerate(moves):
        for t in row.values():
            back[t].append(s)
    live = list(accepting)
    todo = [s for s, ok in enumerate(live) if ok]
    while todo:
        for s in back[todo.pop()]:
            if not live[s]:
                live[s] = True
                todo.append(s)
    return live


@lru_cache(maxsize=256)
def compiled(pattern: str) -> Dfa | None:
    """The pattern's DFA; None where it is not enforced (outside the subset, too large)."""
    try:
        return Dfa(*build(pattern))
    except (Unsupported, RecursionError):
        return None


class Paths:
    """For a pattern with `minLength` / `maxLength` (code points: one byte each here): which
    lengths of path lead from each DFA state to acceptance (`reach[s]` bit r: one of r
    characters does), up to `cap` — maxLength, or minLength plus the state count, past which
    a longer path exists iff one in the window does (a cycle repeats)."""

    def __init__(self, dfa: Dfa, lo: int, hi: int | None) -> None:
        n = len(dfa.moves)
        self.lo, self.hi = lo, hi  # the string's lengths (PatternString reads them here)
        self.cap = hi if hi is not None else lo + n
        succ = [set(row.values()) for row in dfa.moves]
        _charge(n * (self.cap + 1) * max(1, max(map(len, succ))), MAX_PATH_WORK, "pattern with lengths")
        reach = [0] * n
        layer = {s for s in range(n) if dfa.accepting[s]}
        for r in range(self.cap + 1):
            for s in layer:
                reach[s] |= 1 << r
            layer = {s for s in range(n) if succ[s] & layer}
        self.reach = reach

    def viable(self, state: int, count: int) -> bool:
        """Whether `state`, `count` characters in, can still end within the lengths."""
        first = max(0, self.lo - count)
        last = self.cap if self.hi is None else self.hi - count
        return last >= first and (self.reach[state] >> first) & ((1 << (last - first + 1)) - 1) != 0


@lru_cache(maxsize=256)
def paths(dfa: Dfa, lo: int, hi: int | None) -> Paths | None:
    try:
        got = Paths(dfa, lo, hi)
    except Unsupported:
        return None
    return got if got.viable(0, 0) else None


@dataclass(frozen=True, eq=False)
class PatternRule:
    """What a string is held to: a DFA, and the lengths' paths through it where it has them."""

    dfa: Dfa
    paths: Paths | None


def string_pattern(schema: dict[str, Any], lo: int, hi: int | None) -> PatternRule | None:
    """A string schema's `pattern` (else its known `format`), with its lengths where it has
    them; None where neither is enforced (then the lengths alone are)."""
    pattern, fmt = schema.get("pattern"), schema.get("format")
    if not isinstance(pattern, str):
        pattern = FORMATS.get(fmt) if isinstance(fmt, str) else None
    bounded = bool(lo) or hi is not None
    try:
        dfa = compiled(pattern) if isinstance(pattern, str) else None
        lengths = paths(dfa, lo, hi) if dfa is not None and bounded else None
    except OverBudget:
        return None
    return None if dfa is None or (bounded and lengths is None) else PatternRule(dfa, lengths)


def fits_pattern(schema: dict[str, Any], value: str) -> bool:
    """Whether an enum/const string may be written where the schema's pattern is enforced."""
    rule = string_pattern(schema, 0, None)
    return rule is None or rule.dfa.matches(value)


class PatternString(Leaf):
    """A string whose body is a walk through the rule's DFA, within its paths' lengths;
    frames `(self, state, count)`, the count saturated at `lo` when there is no `hi`."""

    __slots__ = ("dfa", "paths", "lo", "hi")

    def __init__(self, rule: PatternRule) -> None:
        self.dfa, self.paths = rule.dfa, rule.paths
        self.lo, self.hi = (rule.paths.lo, rule.paths.hi) if rule.paths is not None else (0, None)

    def first_bytes(self) -> Iterable[int]:
        return (QUOTE,)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return (((self, 0, 0), parents),)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        _, state, count = thread[0]
        if byte == QUOTE:
            return thread[1] if self.dfa.accepting[state] and count >= self.lo else ()
        nxt = self.dfa.moves[state].get(byte) if byte in ALPHABET else None
        if nxt is None:
            return ()
        if self.paths is None:
            return (((self, nxt, 0), thread[1]),)
        count = count + 1 if self.hi is not None or count < self.lo else count
        return (((self, nxt, count), thread[1]),) if self.paths.viable(nxt, count) else ()

    def can_end(self, frame: Frame) -> bool:
        return False
