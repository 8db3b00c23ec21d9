"""The vocabulary as a grammar sees it: each token's bytes in a byte trie laid out flat.

Building a token mask walks the trie from a grammar state, advancing the state one byte
per edge and pruning every subtree whose first byte the grammar refuses, so tokens that
share a prefix share its work. The trie is kept as flat arrays in preorder (a node's
subtree is the range [node, skip[node])), ~3 MB for a 150K vocabulary where nested
dicts take ~95 MB.

Inside an unconstrained JSON string almost every byte keeps the grammar where it is
(`FREE_STRING_BYTES`; a raw-text grammar frees others), so the walk does not visit such
subtrees: per set of free bytes (`FreeClass`), `nonfree_depth[n]` (the depth of the last
byte on the path to node n that is not free) says which nodes below a string's opening
are reached through free bytes alone, and `nonfree_below[n]` says whether the walk must
still descend into n for the rest.
A string with a length bound counts characters and validates UTF-8, so there the nodes
below must also parse as UTF-8 from the root (`utf8_mode[n]` ≥ 0: the decoder's mode after
the path, 0 at a character boundary) and hold few enough characters (`chars[n]`: ASCII and
lead bytes on the path).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from tokenizers import Tokenizer

from edgemoe.structured import FREE_STRING_BYTES
from edgemoe.structured.scalars import MODE_NEXT, UTF8_LEAD
from edgemoe.token_bytes import TokenBytes

FREE_BYTE = bytes(b in FREE_STRING_BYTES for b in range(256))  # a table: FREE_BYTE[b] is 1 for a free byte


class Vocabulary:
    """Token ids `[0, width)` and their bytes (None or b"": never allowed by a grammar:
    special tokens, ids the tokenizer lacks). `node_of_token[t]` is token t's trie node,
    -1 for those never allowed."""

    def __init__(self, token_bytes: Sequence[bytes | None], width: int) -> None:
        self.width = width
        by_bytes: dict[bytes, list[int]] = {}
        for t in range(min(width, len(token_bytes))):
            b = token_bytes[t]
            if b:
                by_bytes.setdefault(b, []).append(t)
        self.byte = array("B")  # the edge byte into node n (node 0 is the root: unused)
        self.depth = array("H")  # node 0 has depth 0, its children 1
        self.skip = array("i")  # the first node after n's subtree
        node_of_token = np.full(width, -1, dtype=np.int32)
        parent = array("i")
        self._build(sorted(by_bytes), by_bytes, node_of_token, parent)
        self.num_nodes = len(self.byte)
        self.utf8_mode, self.chars = self._utf8(parent)
        self.max_depth = max(self.depth)
        self.node_of_token = node_of_token
        self.allowed_ever = node_of_token >= 0
        self._parent = np.frombuffer(parent, dtype=np.int32)
        self._classes: dict[bytes, FreeClass] = {}

    def free_class(self, table: bytes) -> "FreeClass":
        """The walk's tables for a set of free bytes (`table[b]` 1 for a free byte; a JSON
        string's FREE_BYTE, or a raw text's): built at its first use, level by level in
        numpy (~10 ms at a 150K vocabulary), then kept."""
        got = self._classes.get(table)
        if got is None:
            got = self._classes[table] = self._build_class(table)
        return got

    def _build_class(self, table: bytes) -> "FreeClass":
        free = np.frombuffer(table, dtype=np.uint8).astype(bool)[np.frombuffer(self.byte, dtype=np.uint8)]
        depth = np.frombuffer(self.depth, dtype=np.uint16)
        order = np.argsort(depth, kind="stable")
        ends = np.searchsorted(depth[order], np.arange(self.max_depth + 2))
        levels = [order[ends[d]:ends[d + 1]] for d in range(1, self.max_depth + 1)]
        nonfree_depth = np.zeros(self.num_nodes, dtype=np.uint16)
        for d, nodes in enumerate(levels, start=1):
            nonfree_depth[nodes] = np.where(free[nodes], nonfree_depth[self._parent[nodes]], d)
        below = np.zeros(self.num_nodes, dtype=np.uint8)
        for nodes in reversed(levels):
            marked = nodes[(below[nodes] != 0) | ~free[nodes]]
            below[self._parent[marked]] = 1
        return FreeClass(table, nonfree_depth, below.tobytes())

    def _build(self, keys: list[bytes], ids: dict[bytes, list[int]], node_of_token: np.ndarray,
               parent: array) -> None:
        """Preorder nodes from the sorted keys: each key adds the nodes past its common
        prefix with the key before; a node's skip is set when the path leaves it."""
        self.byte.append(0)
        self.depth.append(0)
        self.skip.append(0)
        parent.append(0)
        path = [0]  # node index at each depth of the current key
        prev = b""
        for key in keys:
            common = _common_prefix(prev, key)
            for node in path[common + 1:]:
                self.skip[node] = len(self.byte)
            del path[common + 1:]
            for d in range(common, len(key)):
                n = len(self.byte)
                b = key[d]
                self.byte.append(b)
                self.depth.append(d + 1)
                self.skip.append(0)
                parent.append(path[-1])
                path.append(n)
            for t in ids[key]:
                node_of_token[t] = path[-1]
            prev = key
        for node in path:
            self.skip[node] = len(self.byte)

    def _utf8(self, parent: array) -> tuple[np.ndarray, np.ndarray]:
        """Each node's UTF-8 decoder mode after its path (-1: not valid UTF-8) and its
        path's character count (ASCII and lead bytes), as a bounded string counts them."""
        mode = array("b", bytes(len(self.byte)))
        chars = array("H", bytes(2 * len(self.byte)))
        for n in range(1, len(self.byte)):
            m, b, p = mode[parent[n]], self.byte[n], parent[n]
            if m < 0:
                mode[n], chars[n] = -1, chars[p]
            elif m:  # inside a sequence: a continuation byte, or invalid
                mode[n], chars[n] = MODE_NEXT[m].get(b, -1), chars[p]
            else:
                mode[n] = 0 if b < 0x80 else (UTF8_LEAD[b] or -1)
                chars[n] = chars[p] + 1
        return np.frombuffer(mode, dtype=np.int8), np.frombuffer(chars, dtype=np.uint16)


class FreeClass:
    """One set of free bytes and the walk's tables for it: `nonfree_depth[n]` the depth of
    the last byte on the path to node n that is not free, `nonfree_below[n]` 1 where a byte
    below n is not free (bytes: indexed from Python as ints)."""

    __slots__ = ("table", "nonfree_depth", "nonfree_below")

    def __init__(self, table: bytes, nonfree_depth: np.ndarray, nonfree_below: bytes) -> None:
        self.table, self.nonfree_depth, self.nonfree_below = table, nonfree_depth, nonfree_below


def grammar_token_bytes(tokenizer: Tokenizer) -> list[bytes | None]:
    """Each token id's bytes, None for added tokens (`<|im_end|>`, `<think>`, `<tool_call>`):
    control text, never part of a structured value."""
    token_bytes = TokenBytes(tokenizer)
    return [None if t in token_bytes.added else token_bytes(t)
            for t in range(tokenizer.get_vocab_size(with_added_tokens=True))]


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
