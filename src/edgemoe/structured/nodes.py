"""Runtime slots and container leaves: objects (declared or free keys), arrays, the root.

A `Slot` is one place where a JSON value goes: the alternatives (leaves) it allows, with a
table from first byte to the leaves that can start with it, so anyOf costs nothing until
a value starts. Containers push a frame holding their phase, their nesting depth and the
whitespace read in the current gap (always last); a child value is started with the
container's "after value" thread already built as its parent set, so a finished value
simply returns its parents.

Nesting stops at MAX_NESTING without dead ends: every slot and leaf knows the least
nesting its values need (`md`), a leaf starts only where it fits, and an optional part
(optional property, array item past minItems, dict entry) is offered only if it fits.
Required parts always fit, because a container's own `md` counts them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterable, Sequence

from edgemoe.structured.scalars import (
    COLON, COMMA, DONE_PARENTS, FREE, FREE_BODY, IS_WS, LBRACE, LBRACKET, MAX_NESTING, MAX_WS,
    NUMBER, QUOTE, RBRACE, RBRACKET, Leaf, Literals, Parents, Thread,
)


class Slot:
    """Where one value goes: its alternatives, a byte -> starting leaves table, and `md`,
    the least nesting a value of it needs."""

    __slots__ = ("leaves", "first", "md")

    def __init__(self, md: int = 0) -> None:
        self.leaves: tuple[Leaf, ...] = ()
        self.first: tuple[tuple[Leaf, ...], ...] = ((),) * 256
        self.md = md

    def set_leaves(self, leaves: Iterable[Leaf]) -> None:
        """Fix the alternatives (set once, after the whole grammar is built: slots recurse)."""
        self.leaves = tuple(leaves)
        table: list[list[Leaf]] = [[] for _ in range(256)]
        for leaf in self.leaves:
            for b in leaf.first_bytes():
                table[b].append(leaf)
        self.first = tuple(tuple(t) for t in table)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        """Threads after a value's first byte, one per alternative that takes it and fits."""
        leaves = self.first[byte]
        if len(leaves) == 1:
            leaf = leaves[0]
            return leaf.begin(byte, parents, depth) if depth + leaf.md <= MAX_NESTING else ()
        out: list[Thread] = []
        for leaf in leaves:
            if depth + leaf.md <= MAX_NESTING:
                out.extend(leaf.begin(byte, parents, depth))
        return out

    def fits(self, depth: int) -> bool:
        """Whether some value of this slot can start inside a container at `depth`."""
        return depth + self.md <= MAX_NESTING


def _gap(frame: tuple, parents: Parents) -> Iterable[Thread]:
    """One more whitespace byte in the current gap (frame[-1] counts them), up to MAX_WS."""
    ws = frame[-1]
    if ws >= MAX_WS:
        return ()
    return ((frame[:-1] + (ws + 1,), parents),)


def _after(frame: tuple, parents: Parents) -> Parents:
    """The parent set of a child value: the container's frame, resumed after the value."""
    return frozenset(((frame, parents),))


class ObjectLeaf(Leaf):
    """An object with declared properties, written in declared order: required ones always,
    optional ones when chosen. Frames: (leaf, OPEN, last written index, depth, ws) after '{'
    or ','; (leaf, KEY, trie node, lo, hi, depth) inside a key; (leaf, COLON|VALUE|AFTER,
    index, depth, ws)."""

    __slots__ = ("slots", "required", "n", "hi_for", "closable", "kids", "idxs", "done", "md", "opt_md")
    OPEN, KEY, COLON_, VALUE, AFTER = range(5)

    def __init__(self, keys: Sequence[bytes], slots: Sequence[Slot], required: Sequence[bool]) -> None:
        n = self.n = len(keys)
        self.slots, self.required = tuple(slots), tuple(required)
        self.md = 1 + max((s.md for s, r in zip(slots, required) if r), default=0)
        self.opt_md = max((s.md for s, r in zip(slots, required) if not r), default=0)
        # closable[k]: no required property at index >= k; hi_for[k]: the last property the
        # next key may name when the previous one was k-1 (up to the first required one).
        closable = [True] * (n + 1)
        hi_for = [n - 1] * (n + 1)
        for k in range(n - 1, -1, -1):
            closable[k] = closable[k + 1] and not required[k]
            hi_for[k] = k if required[k] else hi_for[k + 1]
        self.closable, self.hi_for = tuple(closable), tuple(hi_for)
        kids: list[dict[int, int]] = [{}]
        idxs: list[list[int]] = [[]]
        done = [-1]
        for j, key in enumerate(keys):
            node = 0
            idxs[0].append(j)
            for b in key:
                nxt = kids[node].get(b)
                if nxt is None:
                    nxt = kids[node][b] = len(kids)
                    kids.append({})
                    idxs.append([])
                    done.append(-1)
                node = nxt
                idxs[node].append(j)
            done[node] = j
        self.kids = tuple(kids)
        self.idxs = tuple(tuple(i) for i in idxs)
        self.done = tuple(done)

    def first_bytes(self) -> Iterable[int]:
        return (LBRACE,)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return (((self, self.OPEN, -1, depth + 1, 0), parents),)

    def _live(self, idxs: tuple[int, ...], lo: int, hi: int, depth: int) -> tuple[int, int] | None:
        """The first and last candidate in `idxs` within [lo, hi] that fits at `depth`."""
        i = bisect_left(idxs, lo)
        k = bisect_right(idxs, hi) - 1
        if i > k:
            return None
        if depth + self.opt_md <= MAX_NESTING:
            return idxs[i], idxs[k]
        ok = [j for j in idxs[i:k + 1] if self.required[j] or self.slots[j].fits(depth)]
        return (ok[0], ok[-1]) if ok else None

    def _key(self, node: int, lo: int, hi: int, depth: int, byte: int, parents: Parents) -> Iterable[Thread]:
        """Key bytes: keep the candidate properties in [lo, hi] whose key goes on with `byte`
        (lo/hi snapped to live candidates, so equal candidate sets give equal frames)."""
        child = self.kids[node].get(byte)
        if child is None:
            return ()
        live = self._live(self.idxs[child], lo, hi, depth)
        if live is None:
            return ()
        j = self.done[child]
        if j >= 0:
            return (((self, self.COLON_, j, depth, 0), parents),)
        return (((self, self.KEY, child, live[0], live[1], depth), parents),)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        frame, parents = thread
        phase = frame[1]
        if phase == self.KEY:
            return self._key(frame[2], frame[3], frame[4], frame[5], byte, parents)
        if IS_WS[byte]:
            return _gap(frame, parents)
        j, depth = frame[2], frame[3]
        if phase == self.VALUE:
            return self.slots[j].begin(byte, _after((self, self.AFTER, j, depth, 0), parents), depth)
        if phase == self.AFTER:
            if byte == COMMA and j + 1 < self.n:
                if self._live(self.idxs[0], j + 1, self.hi_for[j + 1], depth) is not None:
                    return (((self, self.OPEN, j, depth, 0), parents),)
                return ()
            return parents if byte == RBRACE and self.closable[j + 1] else ()
        if phase == self.COLON_:
            return (((self, self.VALUE, j, depth, 0), parents),) if byte == COLON else ()
        if byte == QUOTE:  # OPEN: j is the last property written (-1 after '{')
            return self._key(0, j + 1, self.hi_for[j + 1], depth, byte, parents)
        return parents if byte == RBRACE and j < 0 and self.closable[0] else ()


class DictLeaf(Leaf):
    """An object with arbitrary string keys, every value from one slot.
    Frames: (leaf, phase, depth, ws); a key is a free string whose parent is the COLON frame."""

    __slots__ = ("value",)
    md = 1
    OPEN0, OPEN, COLON_, VALUE, AFTER = range(5)

    def __init__(self, value: Slot) -> None:
        self.value = value

    def first_bytes(self) -> Iterable[int]:
        return (LBRACE,)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return (((self, self.OPEN0, depth + 1, 0), parents),)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        frame, parents = thread
        if IS_WS[byte]:
            return _gap(frame, parents)
        phase, depth = frame[1], frame[2]
        if phase == self.VALUE:
            return self.value.begin(byte, _after((self, self.AFTER, depth, 0), parents), depth)
        if phase == self.AFTER:
            if byte == COMMA:
                return (((self, self.OPEN, depth, 0), parents),) if self.value.fits(depth) else ()
            return parents if byte == RBRACE else ()
        if phase == self.COLON_:
            return (((self, self.VALUE, depth, 0), parents),) if byte == COLON else ()
        if byte == QUOTE and self.value.fits(depth):
            return ((FREE_BODY, _after((self, self.COLON_, depth, 0), parents)),)
        return parents if byte == RBRACE and phase == self.OPEN0 else ()


class ArrayLeaf(Leaf):
    """An array: position i holds prefix[i], then `items`; lo <= length <= hi (hi None: any).
    Frames: (leaf, OPEN|AFTER|NEXT, items so far, depth, ws); with no upper bound the count
    stops at `sat`, past which every position means the same, so such states compare equal."""

    __slots__ = ("prefix", "items", "lo", "hi", "sat", "md")
    OPEN, AFTER, NEXT = range(3)

    def __init__(self, prefix: Sequence[Slot], items: Slot | None, lo: int, hi: int | None) -> None:
        self.prefix, self.items, self.lo, self.hi = tuple(prefix), items, lo, hi
        self.sat = max(len(self.prefix), lo)
        need = [self._slot(i) for i in range(min(lo, len(self.prefix) + 1))]
        self.md = 1 + max((s.md for s in need if s is not None), default=0)

    def _slot(self, i: int) -> Slot | None:
        """The slot of position i."""
        return self.prefix[i] if i < len(self.prefix) else self.items

    def first_bytes(self) -> Iterable[int]:
        return (LBRACKET,)

    def begin(self, byte: int, parents: Parents, depth: int) -> Iterable[Thread]:
        return (((self, self.OPEN, 0, depth + 1, 0), parents),)

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        frame, parents = thread
        if IS_WS[byte]:
            return _gap(frame, parents)
        phase, count, depth = frame[1], frame[2], frame[3]
        if phase == self.AFTER:
            if byte == COMMA and (self.hi is None or count < self.hi):
                slot = self._slot(count)
                if slot is not None and slot.fits(depth):
                    return (((self, self.NEXT, count, depth, 0), parents),)
                return ()
            return parents if byte == RBRACKET and count >= self.lo else ()
        if phase == self.OPEN and (byte == RBRACKET or self.hi == 0):
            return parents if byte == RBRACKET and self.lo == 0 else ()
        slot = self._slot(count)
        nxt = count + 1 if self.hi is not None or count < self.sat else self.sat
        return slot.begin(byte, _after((self, self.AFTER, nxt, depth, 0), parents), depth)  # type: ignore[union-attr]


class RootLeaf(Leaf):
    """The state before any byte: the top-level value starts at once (no leading space)."""

    __slots__ = ("slot",)

    def __init__(self, slot: Slot) -> None:
        self.slot = slot

    def step(self, thread: Thread, byte: int) -> Iterable[Thread]:
        return self.slot.begin(byte, DONE_PARENTS, 0)


JSON_WORDS = Literals((b"true", b"false", b"null"))
ANY = Slot()  # any JSON value (nesting bounded by MAX_NESTING)
ANY.set_leaves([FREE, NUMBER, JSON_WORDS, DictLeaf(ANY), ArrayLeaf((), ANY, 0, None)])
ANY_OBJECT = DictLeaf(ANY)  # OpenAI's {"type": "json_object"}
