"""A radix tree over KV pages: the `--cache-type radix` prefix cache.

Each edge holds whole pages: a node's `key` is `len(pages) * page_size` tokens and
`pages[j]` holds the KV of the key's j-th page-sized chunk. Children are keyed by their
first chunk, and nodes are split only at page boundaries, so any `page_size >= 1` works
and a partial page never enters the tree.

NOTE: invariants kept by every method
- `lock_ref` counts the outstanding locks at or below a node (a lock increments the
  whole path up to the root), so a node's lock_ref >= each child's: an unlocked node
  has an unlocked subtree, and `root.lock_ref` is the number of outstanding locks.
- `last_access` comes from a per-operation counter, not the clock, so eviction is
  deterministic. The tree is split wherever an access ends, so all pages of one node
  share one access time and leaf pages never tie.
- A handle is the node that ends the matched prefix. Splits keep that node object as
  the deeper half, so a handle keeps naming the same prefix; eviction marks removed
  nodes dead, which `lock` detects.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

from edgemoe.cache.prefix_cache import (
    InsertResult,
    PagePool,
    PrefixCache,
    PrefixMatch,
    Snapshot,
    StaleHandle,
    _check_no_snapshots,
)

Tokens = tuple[int, ...]


class _Node:
    __slots__ = ("key", "pages", "parent", "children", "lock_ref", "last_access", "uid", "alive", "digest", "snapshot")

    def __init__(
        self, key: Tokens, pages: list[int], parent: _Node | None, last_access: int, uid: int
    ) -> None:
        self.key = key
        self.pages = pages
        self.parent = parent
        self.children: dict[Tokens, _Node] = {}
        self.lock_ref = 0
        self.last_access = last_access
        self.uid = uid  # creation order: a deterministic tie-break for the eviction heap
        self.alive = True
        self.digest: bytes | None = None  # the prefix's digest at the node's end (tiered caches)
        self.snapshot: int | None = None  # a GDN state row at the node's end (tiered caches)

    def __repr__(self) -> str:
        return f"_Node(uid={self.uid}, pages={self.pages}, lock_ref={self.lock_ref})"


class RadixPrefixCache(PrefixCache):
    """Longest-prefix match at page granularity, locks along paths, LRU leaf eviction.

    The contract is `PrefixCache`'s. `pool` receives evicted pages (`pool.free`); the
    cache never allocates. Matching/inserting n tokens costs O(n) (tuple slices and
    one dict lookup per node); `evict` scans the leaves, O(nodes).
    """

    def __init__(self, page_size: int, pool: PagePool) -> None:
        super().__init__(page_size)
        if pool.page_size != page_size:
            raise ValueError(f"pool page_size {pool.page_size} != cache page_size {page_size}")
        self._pool = pool
        self._init_tree()

    def _init_tree(self) -> None:
        self._clock = 0
        self._uids = itertools.count()
        self._root = _Node((), [], None, 0, next(self._uids))
        self._owned: set[int] = set()  # every page in the tree: catches double owners
        self._evictable = 0

    # -- the PrefixCache interface ------------------------------------------------------

    def match(self, token_ids: Sequence[int], *, record: bool = True) -> PrefixMatch:
        tokens = tuple(token_ids)
        path = self._descend(tokens, len(tokens) // self.page_size)
        self._touch(path)
        pages = [p for node in path for p in node.pages]
        if record:
            self.record_query(len(tokens), len(pages) * self.page_size)
        handle = path[-1] if path else self._root
        return PrefixMatch(len(pages) * self.page_size, pages, handle)

    def lock(self, handle: object) -> None:
        node: _Node | None = self._live(handle)
        while node is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: object) -> None:
        leaf = self._live(handle)
        if leaf.lock_ref == 0:
            raise ValueError(f"unlock of a handle that is not locked: {leaf!r}")
        node: _Node | None = leaf
        while node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.pages)
            node = node.parent

    def insert(
        self, token_ids: Sequence[int], pages: Sequence[int], snapshots: Sequence[Snapshot] = ()
    ) -> InsertResult:
        _check_no_snapshots(snapshots)
        num_full = len(token_ids) // self.page_size
        if len(pages) < num_full:
            raise ValueError(f"{len(pages)} pages cannot hold {len(token_ids)} tokens")
        if len(set(pages)) != len(pages):
            raise ValueError(f"page table names a page twice: {list(pages)}")
        tokens = tuple(token_ids)
        path = self._descend(tokens, num_full)
        cached = [p for node in path for p in node.pages]
        duplicates = [mine for mine, theirs in zip(pages, cached) if mine != theirs]
        new = list(pages[len(cached) : num_full])
        to_free = duplicates + list(pages[num_full:])
        foreign = [p for p in new + to_free if p in self._owned]
        if foreign:
            raise ValueError(f"pages {foreign} belong to the cache at another position")
        if new:
            path.append(self._add_child(path[-1] if path else self._root, tokens, len(cached), new))
        self._touch(path)
        return InsertResult(num_full * self.page_size, len(new), to_free)

    def evict(self, num_pages: int) -> int:
        if num_pages <= 0 or not self._evictable:
            return 0  # skip the leaf scan
        heap = [(n.last_access, n.uid, n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, _, node = heapq.heappop(heap)
            surplus = len(node.pages) - (num_pages - len(freed))
            if surplus > 0:
                # Free only the tail pages asked for: keep the rest of the prefix cached.
                self._split(node, surplus)
            freed.extend(node.pages)
            parent = self._remove(node)
            if parent is not self._root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        if freed:
            self._pool.free(freed)
        return len(freed)

    def reset(self) -> None:
        if self._root.lock_ref:
            raise RuntimeError(f"reset with {self._root.lock_ref} locked handles outstanding")
        pages: list[int] = []
        for node in self._nodes():
            node.alive = False
            pages.extend(node.pages)
        if pages:
            self._pool.free(pages)
        self._root.alive = False
        self._init_tree()
        self.queries = self.query_tokens = self.hit_tokens = 0

    @property
    def total_pages(self) -> int:
        return len(self._owned)

    @property
    def evictable_pages(self) -> int:
        return self._evictable

    # -- tree mechanics -----------------------------------------------------------------

    def _descend(self, tokens: Tokens, num_pages: int) -> list[_Node]:
        """The nodes spelling the longest cached prefix of tokens[: num_pages * page_size].

        Splits the last node if the match ends inside its edge, so the path covers
        exactly the matched pages.
        """
        ps = self.page_size
        path: list[_Node] = []
        node, i = self._root, 0
        while i < num_pages:
            child = node.children.get(tokens[i * ps : (i + 1) * ps])
            if child is None:
                break
            common = self._common_pages(child, tokens, i, num_pages)
            if common < len(child.pages):
                child = self._split(child, common)
            path.append(child)
            node, i = child, i + common
        return path

    def _common_pages(self, node: _Node, tokens: Tokens, start_page: int, num_pages: int) -> int:
        """How many whole pages of node's edge equal tokens from start_page on (>= 1)."""
        ps = self.page_size
        n = min(len(node.pages), num_pages - start_page) * ps
        start = start_page * ps
        if node.key[:n] == tokens[start : start + n]:
            return n // ps
        first_diff = next(j for j in range(n) if node.key[j] != tokens[start + j])
        return first_diff // ps

    def _split(self, node: _Node, num_pages: int) -> _Node:
        """Cut node's edge after num_pages pages; return the new upper node.

        `node` keeps the lower half so handles to it still name the same prefix.
        """
        ps, parent = self.page_size, node.parent
        assert parent is not None and 0 < num_pages < len(node.pages)
        upper = _Node(node.key[: num_pages * ps], node.pages[:num_pages], parent,
                      node.last_access, next(self._uids))  # fmt: skip
        upper.lock_ref = node.lock_ref  # every lock through node passes through upper
        node.key, node.pages = node.key[num_pages * ps :], node.pages[num_pages:]
        node.parent = upper
        upper.children[node.key[:ps]] = node
        parent.children[upper.key[:ps]] = upper
        return upper

    def _add_child(self, parent: _Node, tokens: Tokens, start_page: int, pages: list[int]) -> _Node:
        ps = self.page_size
        key = tokens[start_page * ps : (start_page + len(pages)) * ps]
        child = _Node(key, pages, parent, self._clock, next(self._uids))
        parent.children[key[:ps]] = child
        self._owned.update(pages)
        self._evictable += len(pages)  # a new node is unlocked
        return child

    def _remove(self, node: _Node) -> _Node:
        """Detach an unlocked leaf; return its parent."""
        parent = node.parent
        assert parent is not None and not node.children and node.lock_ref == 0
        del parent.children[node.key[: self.page_size]]
        node.alive = False
        self._owned.difference_update(node.pages)
        self._evictable -= len(node.pages)
        return parent

    def _touch(self, path: list[_Node]) -> None:
        self._clock += 1
        for node in path:
            node.last_access = self._clock

    def _live(self, handle: object) -> _Node:
        if not isinstance(handle, _Node):
            raise ValueError(f"not a RadixPrefixCache handle: {handle!r}")
        if not handle.alive:
            raise StaleHandle(f"handle {handle!r} was evicted since match; match again")
        return handle

    def _nodes(self) -> Iterator[_Node]:
        """Every node except the root, parents before children."""
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _leaves(self) -> Iterator[_Node]:
        return (node for node in self._nodes() if not node.children)
