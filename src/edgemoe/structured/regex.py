"""A regular expression (JSON Schema's `pattern`, ECMA-262 syntax) as an NFA over the
printable ASCII characters a constrained string is written in (0x20-0x7E but `"` and `\\`,
which would need escapes).

The subset: literals, `.`, classes `[...]` / `[^...]` with ranges, the escapes `\\d \\w \\s
\\D \\W \\S` and escaped punctuation, groups `(...)` / `(?:...)` / `(?<name>...)`,
alternation, the quantifiers `* + ? {n} {n,} {n,m}` (lazy forms mean the same language), `^`
at the start and `$` at the end. Anything else (lookaround, backreferences, anchors inside,
`\\b`, `\\u` escapes) raises `Unsupported`: the caller leaves such a pattern unenforced.
What is no ECMA-262 regular expression at all (an unclosed group or class, a stray `)`, a
quantifier with nothing to repeat, `{5,2}`, `[z-a]`, a trailing backslash) raises `Invalid`:
a client's mistake, refused (`syntax_error`), not silently left unenforced.
Characters outside the alphabet are never written: a class or `.` matches its ASCII
members only, a literal outside it matches nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ALPHABET = frozenset(range(0x20, 0x7F)) - {0x22, 0x5C}
MAX_REPEAT = 100  # {n,m} bounds: the NFA grows with them
MAX_NFA = 20_000  # states

_DIGIT = frozenset(range(0x30, 0x3A))
_WORD = _DIGIT | frozenset(range(0x41, 0x5B)) | frozenset(range(0x61, 0x7B)) | {0x5F}
_SPACE = frozenset({0x20})  # of \s's members, only the space is in the alphabet
_CLASSES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_BOUND = re.compile(r"\{(\d+)(,(\d*))?\}")


class Unsupported(ValueError):
    """A pattern outside the subset (it is then accepted but not enforced)."""


class Invalid(Unsupported):
    """A pattern that is not a regular expression (ECMA-262 refuses it too)."""


@dataclass
class Nfa:
    """Thompson NFA: `moves[s]` (chars, target) pairs, `eps[s]` targets; one start, one accept."""

    moves: list[list[tuple[frozenset[int], int]]] = field(default_factory=list)
    eps: list[list[int]] = field(default_factory=list)

    def state(self) -> int:
        if len(self.moves) >= MAX_NFA:
            raise Unsupported(f"pattern too large (over {MAX_NFA} NFA states)")
        self.moves.append([])
        self.eps.append([])
        return len(self.moves) - 1


# The parse tree: ("chars", set) | ("cat", [..]) | ("alt", [..]) | ("rep", node, lo, hi|None)
Node = tuple


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def take(self) -> str:
        c = self.peek()
        if not c:
            raise Invalid("it ends early (an unclosed group or class, or a trailing backslash)")
        self.i += 1
        return c

    def alternation(self) -> Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self) -> Node:
        items = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified(self.atom()))
        return ("cat", items)

    def quantified(self, node: Node) -> Node:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif self._is_bound():
            lo, hi = self._bound()
        else:
            return node
        if self.peek() == "?":  # lazy: the same language
            self.i += 1
        if self.peek() in ("*", "+", "?") or self._is_bound():
            raise Invalid("a quantifier on a quantifier")
        return ("rep", node, lo, hi)

    def _is_bound(self) -> bool:
        return _BOUND.match(self.text, self.i) is not None

    def _bound(self) -> tuple[int, int | None]:
        m = _BOUND.match(self.text, self.i)
        assert m is not None
        self.i = m.end()
        lo = int(m[1])
        hi = lo if m[2] is None else (int(m[3]) if m[3] else None)
        if hi is not None and hi < lo:
            raise Invalid(f"the repetition bound {m[0]} is out of order")
        if max(lo, hi or 0) > MAX_REPEAT:
            raise Unsupported(f"repetition bound {m[0]} (at most {MAX_REPEAT})")
        return lo, hi

    def atom(self) -> Node:
        c = self.take()
        if c == "(":
            if self.peek() == "?":
                self.i += 1
                kind = self.take()
                end = self.text.find(">", self.i)
                if kind == "<" and self.peek() not in ("=", "!") and end > 0:
                    self.i = end + 1  # a named group
                elif kind != ":":
                    raise Unsupported("lookaround or another (? group")
            node = self.alternation()
            if self.take() != ")":
                raise Invalid("unbalanced parentheses")
            return node
        if c == "[":
            return ("chars", self._class())
        if c == ".":
            return ("chars", ALPHABET)
        if c == "\\":
            return ("chars", self._escape())
        if c in "^$":
            raise Unsupported("an anchor inside the pattern")
        if c in "*+?)" or (c == "{" and _BOUND.match(self.text, self.i - 1)):
            raise Invalid(f"{c!r} has nothing to repeat")
        return ("chars", frozenset({ord(c)}) & ALPHABET)

    def _escape(self) -> frozenset[int]:
        got = self._escaped()
        return got if isinstance(got, frozenset) else frozenset({got}) & ALPHABET

    def _escaped(self) -> int | frozenset[int]:
        """After a backslash: a class (`\\d`, `\\W`, ...) or an escaped punctuation character."""
        c = self.take()
        if c.lower() in _CLASSES:
            base = _CLASSES[c.lower()]
            return base if c.islower() else ALPHABET - base
        if c.isalnum():  # \b, \1, \u, \n, \t, ...: not in the subset (or not writable)
            raise Unsupported(f"the escape \\{c}")
        return ord(c)

    def _class(self) -> frozenset[int]:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        if self.peek() == "]":  # ECMA's empty class `[]` (or `[^]`, any character): not in the subset
            raise Unsupported("an empty class")
        members: set[int] = set()
        while self.peek() != "]":
            lo = self._class_char()
            if isinstance(lo, frozenset):
                members |= lo
                continue
            if self.peek() == "-" and self.text[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self._class_char()
                if isinstance(hi, frozenset):
                    raise Unsupported("a class range ending in a class escape")
                if hi < lo:
                    raise Invalid(f"the class range {chr(lo)}-{chr(hi)} is out of order")
                members |= set(range(lo, hi + 1))
            else:
                members.add(lo)
        self.i += 1
        chosen = frozenset(members) & ALPHABET
        return ALPHABET - chosen if negate else chosen

    def _class_char(self) -> int | frozenset[int]:
        c = self.take()
        return ord(c) if c != "\\" else self._escaped()


def parse(pattern: str) -> Node:
    """The parse tree of a whole pattern, unanchored ends made explicit (`.*`)."""
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[1 if start else 0: len(pattern) - 1 if end else len(pattern)]
    p = _Parser(body)
    tree = p.alternation()
    if p.i != len(body):
        raise Invalid("unbalanced parentheses")
    anything = ("rep", ("chars", ALPHABET), 0, None)
    return ("cat", [*([] if start else [anything]), tree, *([] if end else [anything])])


def syntax_error(pattern: str) -> str | None:
    """Why `pattern` is no regular expression at all; None where it is one (in the subset
    or not: a pattern outside it is accepted, unenforced). Linear in the pattern's length."""
    try:
        parse(pattern)
    except Invalid as exc:
        return str(exc)
    except (Unsupported, RecursionError):
        return None
    return None


def build(pattern: str) -> tuple[Nfa, int, int]:
    """The pattern's NFA, its start and accept states."""
    nfa = Nfa()
    start, accept = _emit(nfa, parse(pattern))
    return nfa, start, accept


def _emit(nfa: Nfa, node: Node) -> tuple[int, int]:
    kind = node[0]
    if kind == "chars":
        a, b = nfa.state(), nfa.state()
        nfa.moves[a].append((node[1], b))
        return a, b
    if kind == "cat":
        a = b = nfa.state()
        for item in node[1]:
            s, e = _emit(nfa, item)
            nfa.eps[b].append(s)
            b = e
        return a, b
    if kind == "alt":
        a, b = nfa.state(), nfa.state()
        for branch in node[1]:
            s, e = _emit(nfa, branch)
            nfa.eps[a].append(s)
            nfa.eps[e].append(b)
        return a, b
    _, sub, lo, hi = node
    a = b = nfa.state()
    for _ in range(lo):  # the required copies
        s, e = _emit(nfa, sub)
        nfa.eps[b].append(s)
        b = e
    if hi is None:  # then any number more
        s, e = _emit(nfa, sub)
        nfa.eps[b].append(s)
        nfa.eps[e].append(s)
        end = nfa.state()
        nfa.eps[b].append(end)
        nfa.eps[e].append(end)
        return a, end
    end = nfa.state()
    nfa.eps[b].append(end)
    for _ in range(hi - lo):  # optional copies, each may stop
        s, e = _emit(nfa, sub)
        nfa.eps[b].append(s)
        nfa.eps[e].append(end)
        b = e
    return a, end
