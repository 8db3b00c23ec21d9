"""Which tokens a grammar allows next: the vocabulary trie walked from a grammar state.

`TokenMasks(grammar, vocab).allowed(state)` is a bool [width] array, exactly the tokens
whose every byte the grammar accepts in turn from `state` (the test compares it with
feeding each token's bytes on its own). It is cached per state: states are equal
whenever the position is the same (inside the string value of one property, whatever
was written in it so far), so most steps of a long output hit the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

from edgemoe.structured.vocab import FREE_BYTE as _FREE
from edgemoe.structured.vocab import FreeClass, Vocabulary
CACHED_MASKS = 256  # per grammar: ~19 KB each, packed, at a 150K vocabulary
MANY_RANGES = 64  # past this many ranges a walk's hits are marked in one vector operation


class ByteGrammar(Protocol):
    """What the walk needs of a grammar (`Grammar`, or `PaddedValue` around one). A grammar
    whose free or counted states free other bytes than a JSON string's (raw text) also has
    `free_table(state) -> bytes` (`table[b]` 1 for a free byte), FREE_BYTE where it doesn't."""

    def advance(self, state: object, byte: int) -> object | None: ...
    def free_string(self, state: object) -> bool: ...
    def string_room(self, state: object) -> int | None: ...


# What a state is to the walk: inside a free string (a free byte keeps the state), inside
# a length-bounded string at a character boundary (free bytes count), or anything else.
OTHER, FREE, COUNTED = 0, 1, 2
UNBOUNDED = 1 << 15  # more characters than any token holds (chars are uint16)


class TokenMasks:
    """The allowed-token masks of one grammar over one vocabulary, cached per state."""

    def __init__(self, grammar: ByteGrammar, vocab: Vocabulary) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self._cache: OrderedDict[object, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def allowed(self, state: object) -> np.ndarray:
        """bool [width]: the tokens allowed from `state` (a fresh array: callers may add to it)."""
        packed = self._cache.get(state)
        if packed is not None:
            self._cache.move_to_end(state)
            self.hits += 1
        else:
            self.misses += 1
            packed = np.packbits(self._mask(state))
            self._cache[state] = packed
            if len(self._cache) > CACHED_MASKS:
                self._cache.popitem(last=False)
        return np.unpackbits(packed, count=self.vocab.width).astype(bool)

    def _mask(self, state: object) -> np.ndarray:
        """A state mixing string threads with others (anyOf of a string and a bounded
        string, say) walks as its parts, each fast, their masks or-ed (`Grammar.split`)."""
        split = getattr(self.grammar, "split", None)
        parts = split(state) if split is not None else [state]
        if len(parts) == 1:
            return self._walk(state)
        mask = self.allowed(parts[0])
        for part in parts[1:]:
            mask |= self.allowed(part)
        return mask

    def _walk(self, state: object) -> np.ndarray:
        v = self.vocab
        ok_nodes = np.zeros(v.num_nodes, dtype=bool)
        explicit, ranges = _Walk(self.grammar, v).run(state)
        ok_nodes[explicit] = True
        if len(ranges) > MANY_RANGES:
            self._mark_many(ok_nodes, ranges)
            return ok_nodes[v.node_of_token] & v.allowed_ever
        for lo, hi, d, max_chars, free in ranges:
            hit = free.nonfree_depth[lo:hi] <= d
            if max_chars >= 0:  # a bounded string: valid UTF-8 and few enough characters
                hit &= (v.utf8_mode[lo:hi] >= 0) & (v.chars[lo:hi] <= max_chars)
            ok_nodes[lo:hi] |= hit
        return ok_nodes[v.node_of_token] & v.allowed_ever

    def _mark_many(self, ok_nodes: np.ndarray, ranges: list[tuple[int, int, int, int, FreeClass]]) -> None:
        """The ranges' hits as one vector operation per free class: a raw string's walk
        re-enters free text after each newline or `<` inside a token (~18K small ranges at
        Qwen's vocabulary), where a numpy call per range would cost ~3 µs each."""
        v = self.vocab
        by_class: dict[int, list[tuple[int, int, int, int, FreeClass]]] = {}
        for r in ranges:
            by_class.setdefault(id(r[4]), []).append(r)
        for group in by_class.values():
            lo, hi, d, max_chars = (np.array(col, dtype=np.int64) for col in list(zip(*group))[:4])
            lengths = hi - lo
            starts = np.cumsum(lengths) - lengths
            nodes = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(lo - starts, lengths)
            hit = group[0][4].nonfree_depth[nodes] <= np.repeat(d, lengths)
            bound = np.repeat(max_chars, lengths)
            counted = bound >= 0  # bounded strings: valid UTF-8 and few enough characters
            hit &= ~counted | ((v.utf8_mode[nodes] >= 0) & (v.chars[nodes] <= bound))
            ok_nodes[nodes[hit]] = True


class _Walk:
    """One walk of the trie from a state: nodes reached by advancing the state edge by edge
    (preorder, a refused edge skips its subtree), and ranges (lo, hi, d, max_chars, free)
    whose nodes are reached from a string state at depth d through its free bytes alone
    (`FreeClass.nonfree_depth[n] <= d`), for a bounded string also as valid UTF-8 with at
    most `max_chars` characters on the path (-1: no such bound): exact because such a
    string accepts a run of free bytes iff it is valid UTF-8 of at most `string_room`
    characters (`Grammar.string_room`).

    Below a string state the walk descends only where a byte that is not free lies below
    (`nonfree_below`): under a free string without advancing (a free byte keeps the
    state), under a bounded one advancing each byte (the count moves)."""

    def __init__(self, grammar: ByteGrammar, vocab: Vocabulary) -> None:
        self.g, self.v = grammar, vocab
        self._room = getattr(grammar, "string_room", None)
        self._table = getattr(grammar, "free_table", None)
        self._json = vocab.free_class(_FREE)
        self.explicit: list[int] = []
        self.ranges: list[tuple[int, int, int, int, FreeClass]] = []

    def kind(self, state: object) -> tuple[int, int]:
        if self.g.free_string(state):
            return FREE, -1
        room = self._room(state) if self._room is not None else None
        return (OTHER, -1) if room is None else (COUNTED, room)

    def free_class(self, state: object) -> FreeClass:
        return self._json if self._table is None else self.v.free_class(self._table(state))

    def origin(self, node: int, hi: int, d: int, state: object) -> tuple[int, FreeClass | None]:
        """Mark the range below a string state reached at `node`; returns its kind and class."""
        kind, room = self.kind(state)
        if kind == OTHER:
            return OTHER, None
        free = self.free_class(state)
        if kind == FREE:
            self.ranges.append((node, hi, d, -1, free))
        else:
            if self.v.utf8_mode[node] != 0:
                return OTHER, None  # the path from the root is mid-character: walk it all
            self.ranges.append((node, hi, d, int(self.v.chars[node]) + min(room, UNBOUNDED), free))
        return kind, free

    def run(self, state: object) -> tuple[list[int], list[tuple[int, int, int, int, FreeClass]]]:
        v, advance = self.v, self.g.advance
        byte, depth, skip = v.byte, v.depth, v.skip
        states: list[object] = [state] * (v.max_depth + 1)
        kind, free = self.origin(0, v.num_nodes, 0, state)
        kinds = [kind] * len(states)
        tables = [free.table if free else b""] * len(states)  # the free bytes at each depth
        belows = [free.nonfree_below if free else b""] * len(states)
        i, n = 1, v.num_nodes
        while i < n:
            d = depth[i] - 1  # the parent's depth
            s, b, k = states[d], byte[i], kinds[d]
            if k and tables[d][b]:  # covered by the range above; descend only towards a non-free byte
                if not belows[d][i]:
                    i = skip[i]
                    continue
                s1 = s if k == FREE else advance(s, b)
                if s1 is None:
                    i = skip[i]
                    continue
                states[d + 1], kinds[d + 1] = s1, (k if k == FREE else self.kind(s1)[0])
                tables[d + 1], belows[d + 1] = tables[d], belows[d]
                i += 1
                continue
            s1 = advance(s, b)
            if s1 is None:
                i = skip[i]
                continue
            self.explicit.append(i)
            k1, free = self.origin(i, skip[i], d + 1, s1)
            if k1 and not free.nonfree_below[i]:  # type: ignore[union-attr]
                i = skip[i]
                continue
            states[d + 1], kinds[d + 1] = s1, k1
            if free is not None:
                tables[d + 1], belows[d + 1] = free.table, free.nonfree_below
            i += 1
        return self.explicit, self.ranges
