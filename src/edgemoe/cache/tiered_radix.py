"""The radix prefix cache with GDN state snapshots on its nodes and a host tier under it.

- **Snapshots** (hybrid models, `states` given): a node may hold a state-pool row with the
  sequence's GDN state after the node's last token. A match ends at the deepest node (or
  host entry) with a snapshot, since a request can only skip the tokens its recurrent
  state has already absorbed; `restore_state` copies that snapshot into the request's
  live row. A running request keeps a rolling snapshot at its latest page boundary
  (`capture_state`) and frozen ones (`freeze_state`: its prompt's end, its latest
  tool-call opener); `insert`
  adopts them at their nodes (a duplicate is freed) and keeps KV pages only up to the
  deepest snapshot, since deeper pages could never be matched. Running out of snapshot
  rows evicts the least recently used node's snapshot.
- **Host tier** (`host` given): an evicted node's pages (and snapshot) are copied to the
  host tier under their prefix digests before the device memory is freed; a match
  extends past the device tree by probing the tier page by page, and revives what it
  uses into fresh device pages (locking those entries first, so making room for them,
  which may spill other pages to the tier, never evicts them).

The `PrefixCache` contract holds unchanged: revived pages are the cache's, as if inserted.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgemoe.cache.host_tier import ROOT_DIGEST, HostTier, chain_digest
from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.prefix_cache import ROLLING, InsertResult, PrefixMatch, Snapshot
from edgemoe.cache.radix import RadixPrefixCache, Tokens, _Node
from edgemoe.cache.state_pool import StatePool


class TieredRadixCache(RadixPrefixCache):
    def __init__(
        self, page_size: int, pool: KVPool, states: StatePool | None = None, host: HostTier | None = None
    ) -> None:
        self.kv, self.states, self.host = pool, states, host
        super().__init__(page_size, pool)

    def _init_tree(self) -> None:
        super()._init_tree()
        self._root.digest = ROOT_DIGEST

    @property
    def stateful(self) -> bool:
        return self.states is not None

    @property
    def num_snapshots(self) -> int:
        return sum(1 for node in self._nodes() if node.snapshot is not None)

    def tier_stats(self) -> dict[str, int]:
        stats = {"state_snapshots": self.num_snapshots} if self.states is not None else {}
        if self.host is not None:
            stats |= {"host_pages": self.host.num_pages, "host_snapshots": self.host.num_snapshots}
        return stats

    # -- match: device path, host extension, cut back to a snapshot, revive ----------------

    def match(self, token_ids: Sequence[int], *, record: bool = True) -> PrefixMatch:
        tokens = tuple(token_ids)
        path = self._descend(tokens, len(tokens) // self.page_size)
        self._touch(path)
        host_keys = self._host_extension(tokens, path)
        cut, on_host = self._cut(path, host_keys)
        path = path[:cut]
        state_row = None
        if on_host:  # revive the host pages first, then the snapshot at their end
            node = self._revive(tokens, path, host_keys[:on_host])
            if node is None:
                path, on_host = self._cut_device(path), 0  # no device room: the device part only
            else:
                path.append(node)
        if self.states is not None and path:
            state_row = self._device_snapshot(path[-1])
            if state_row is None:  # no row to bring a host snapshot back into
                path = self._cut_to_device_snapshots(path)
                state_row = path[-1].snapshot if path else None
        pages = [p for node in path for p in node.pages]
        if record:
            self.record_query(len(tokens), len(pages) * self.page_size)
        return PrefixMatch(len(pages) * self.page_size, pages, path[-1] if path else self._root, state_row)

    def _host_extension(self, tokens: Tokens, path: list[_Node]) -> list[bytes]:
        """Digests of the pages after the device path that the host tier holds, in order
        (hashing each query page once, stopping at the first miss)."""
        if self.host is None:
            return []
        ps, digest = self.page_size, (path[-1].digest if path else ROOT_DIGEST)
        assert digest is not None
        keys, page = [], sum(len(n.pages) for n in path)
        while page < len(tokens) // ps:
            digest = chain_digest(digest, tokens[page * ps : (page + 1) * ps])
            if not self.host.has_page(digest):
                break
            keys.append(digest)
            page += 1
        return keys

    def _cut(self, path: list[_Node], host_keys: list[bytes]) -> tuple[int, int]:
        """(device nodes kept, host pages used): everything, or for a stateful cache the
        deepest position with a snapshot on the device or the host."""
        if self.states is None:
            return len(path), len(host_keys)
        for j in range(len(host_keys), 0, -1):
            if self.host is not None and self.host.has_snapshot(host_keys[j - 1]):
                return len(path), j
        for i in range(len(path), 0, -1):
            if self._has_snapshot(path[i - 1]):
                return i, 0
        return 0, 0

    def _has_snapshot(self, node: _Node) -> bool:
        return node.snapshot is not None or (
            self.host is not None and node.digest is not None and self.host.has_snapshot(node.digest)
        )

    def _cut_device(self, path: list[_Node]) -> list[_Node]:
        if self.states is None:
            return path
        for i in range(len(path), 0, -1):
            if self._has_snapshot(path[i - 1]):
                return path[:i]
        return []

    def _cut_to_device_snapshots(self, path: list[_Node]) -> list[_Node]:
        for i in range(len(path), 0, -1):
            if path[i - 1].snapshot is not None:
                return path[:i]
        return []

    def _revive(self, tokens: Tokens, path: list[_Node], keys: list[bytes]) -> _Node | None:
        """Bring the host pages `keys` (continuing `path`) back as a new device node, or None
        if the device cannot give that many pages even after evicting."""
        assert self.host is not None
        parent = path[-1] if path else self._root
        self.host.lock(keys)
        self.lock(parent)  # NOTE: making room must not evict the path being extended
        try:
            if self.kv.num_free < len(keys):
                self.evict(len(keys) - self.kv.num_free)
            if self.kv.num_free < len(keys):
                return None
            pages = self.kv.alloc(len(keys))
            self.host.load_pages(keys, pages)
            node = self._add_child(parent, tokens, sum(len(n.pages) for n in path), pages)
            self._touch([*path, node])
            return node
        finally:
            self.unlock(parent)
            self.host.unlock(keys)

    def _device_snapshot(self, node: _Node) -> int | None:
        """The node's snapshot row, bringing it back from the host tier if it is there."""
        if node.snapshot is not None or self.host is None or node.digest is None:
            return node.snapshot
        if not self.host.has_snapshot(node.digest):
            return None
        self.host.lock([node.digest])
        try:
            row = self._snapshot_row(keep=node)
            if row is not None:
                self.host.load_snapshot(node.digest, row)
                node.snapshot = row
        finally:
            self.host.unlock([node.digest])
        return row

    # -- snapshots -----------------------------------------------------------------------

    def restore_state(self, match: PrefixMatch, row: int) -> None:
        if match.state_row is not None:
            assert self.states is not None
            self.states.copy_row(match.state_row, row)

    def capture_state(self, held: list[Snapshot], row: int, num_tokens: int) -> None:
        if self.states is None or num_tokens == 0 or num_tokens % self.page_size:
            return
        rolling = next((s for s in held if s.kind == ROLLING), None)
        if rolling is None:
            new_row = self._snapshot_row()
            if new_row is None:
                return  # every row is in use: this boundary goes without a snapshot
            rolling = Snapshot(num_tokens, new_row)
            held.append(rolling)
        self.states.copy_row(row, rolling.row)
        rolling.num_tokens = num_tokens

    def freeze_state(self, held: list[Snapshot], kind: str) -> None:
        if self.states is None:
            return
        rolling = next((s for s in held if s.kind == ROLLING), None)
        if rolling is None:
            return
        for older in [s for s in held if s.kind == kind]:  # one of each kind: the latest
            held.remove(older)
            self.states.free_snapshot(older.row)
        rolling.kind = kind

    def _snapshot_row(self, keep: _Node | None = None) -> int | None:
        """A free snapshot row, evicting the least recently used node's snapshot (to the host
        tier when there is one) if none is free; never `keep`'s."""
        assert self.states is not None
        row = self.states.alloc_snapshot()
        if row is not None:
            return row
        held = [n for n in self._nodes() if n.snapshot is not None and n is not keep]
        if not held:
            return None
        victim = min(held, key=lambda n: (n.last_access, n.uid))
        self._drop_snapshot(victim)
        return self.states.alloc_snapshot()

    def _drop_snapshot(self, node: _Node) -> None:
        assert self.states is not None and node.snapshot is not None
        if self.host is not None and node.digest is not None:
            self.host.store_snapshot(node.digest, node.snapshot)
        self.states.free_snapshot(node.snapshot)
        node.snapshot = None

    # -- insert: adopt snapshots, keep pages up to the deepest one -----------------------

    def insert(
        self, token_ids: Sequence[int], pages: Sequence[int], snapshots: Sequence[Snapshot] = ()
    ) -> InsertResult:
        if self.states is None:
            return super().insert(token_ids, pages, snapshots)
        tokens = tuple(token_ids)
        cached = sum(len(n.pages) for n in self._descend(tokens, len(tokens) // self.page_size))
        deepest = max((s.num_tokens for s in snapshots if s.num_tokens <= len(tokens)), default=0)
        # NOTE: pages past the deepest snapshot could never be matched: they go back.
        result = super().insert(tokens[: max(cached * self.page_size, deepest)], pages)
        for snap in snapshots:
            self._adopt(tokens, snap)
        return result

    def _adopt(self, tokens: Tokens, snap: Snapshot) -> None:
        assert self.states is not None
        ps = self.page_size
        path = self._descend(tokens, snap.num_tokens // ps) if 0 < snap.num_tokens <= len(tokens) else []
        node = path[-1] if path and sum(len(n.pages) for n in path) * ps == snap.num_tokens else None
        if node is None or node.snapshot is not None:
            self.states.free_snapshot(snap.row)  # a duplicate, or a prefix the cache lacks
        else:
            node.snapshot = snap.row

    # -- tree mechanics: digests, and spilling to the host tier ----------------------------

    def _add_child(self, parent: _Node, tokens: Tokens, start_page: int, pages: list[int]) -> _Node:
        child = super()._add_child(parent, tokens, start_page, pages)
        child.digest = self._extend(parent.digest, child.key) if self.host is not None else None
        return child

    def _split(self, node: _Node, num_pages: int) -> _Node:
        upper = super()._split(node, num_pages)
        if self.host is not None:
            assert upper.parent is not None
            upper.digest = self._extend(upper.parent.digest, upper.key)
        return upper

    def _remove(self, node: _Node) -> _Node:
        if self.host is not None and node.parent is not None:
            keys = self._page_digests(node.parent.digest, node.key)
            self.host.store_pages(keys, node.pages)
        if node.snapshot is not None:
            self._drop_snapshot(node)
        return super()._remove(node)

    def reset(self) -> None:
        if self.states is not None and not self._root.lock_ref:
            for node in self._nodes():
                if node.snapshot is not None:
                    self.states.free_snapshot(node.snapshot)
                    node.snapshot = None
        super().reset()

    def _page_digests(self, digest: bytes | None, key: Tokens) -> list[bytes]:
        ps, out = self.page_size, []
        assert digest is not None
        for j in range(len(key) // ps):
            digest = chain_digest(digest, key[j * ps : (j + 1) * ps])
            out.append(digest)
        return out

    def _extend(self, digest: bytes | None, key: Tokens) -> bytes:
        return self._page_digests(digest, key)[-1]
