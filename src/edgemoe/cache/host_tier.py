"""The host tier (`--host-cache SIZE`): KV pages and GDN state snapshots that the prefix
cache evicts from the device, kept in (pinned) host memory and copied back on a hit
instead of being recomputed.

Entries are keyed by the digest of the whole token prefix they end (`chain_digest`: each
page's digest hashes the previous one with the page's tokens, so a lookup walks a query
page by page, hashing each page once, and stops at the first miss). A page entry holds
one page's K and V in every attention layer; a snapshot entry one sequence's GDN state
at that page boundary. Each kind has fixed slots in one preallocated buffer, and its own
LRU order; `lock`ed keys are never evicted (a revival locks what it brings back before
it makes room on the device, whose evictions spill here).

Copies run on the current stream in both directions and the host never reads the
buffers, so a page stored and revived in one step is ordered like any device work.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.state_pool import StatePool

ROOT_DIGEST = bytes(16)  # the empty prefix


def chain_digest(prev: bytes, page_tokens: Sequence[int]) -> bytes:
    """The digest of a prefix: `prev` (the digest before this page) extended by its tokens."""
    return hashlib.blake2b(prev + array("q", page_tokens).tobytes(), digest_size=16).digest()


class TierError(ValueError):
    """The host tier cannot serve this KV or state pool; the message says why."""


class _Slots:
    """Fixed slots keyed by digest: LRU order, locks, a free list (one entry kind)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.of: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, least recently used first
        self.free = list(range(count - 1, -1, -1))
        self.locks: Counter[bytes] = Counter()

    def claim(self, key: bytes) -> int | None:
        """A slot for a new `key`, evicting the least recently used unlocked entry if full."""
        if not self.free:
            victim = next((k for k in self.of if not self.locks[k]), None)
            if victim is None:
                return None
            self.free.append(self.of.pop(victim))
        slot = self.free.pop()
        self.of[key] = slot
        return slot

    def touch(self, key: bytes) -> int | None:
        slot = self.of.get(key)
        if slot is not None:
            self.of.move_to_end(key)
        return slot


class HostTier:
    """Pinned host copies of evicted KV pages and snapshots. Not thread-safe: the engine loop owns it."""

    def __init__(self, kv: KVPool, page_slots: int, states: StatePool | None = None, snapshot_slots: int = 0) -> None:
        if not (callable(getattr(kv, "read_pages", None)) and callable(getattr(kv, "write_pages", None))):
            raise TierError(
                f"host_cache (--host-cache): the KV pool {type(kv).__name__} cannot copy pages out and back "
                "(read_pages/write_pages): its layout cannot be restored from the host tier"
            )
        if page_slots < 1 or (states is not None and snapshot_slots < 1):
            raise TierError("host_cache (--host-cache) is too small for one KV page (and one GDN state snapshot)")
        self.kv, self.states = kv, states
        pin = kv.k.device.type == "cuda"
        # One buffer per per-slot tensor of the pool (K, V, index keys): [slots, L, page_size, ...].
        self.pages = [
            torch.empty((page_slots, t.shape[0], kv.page_size, *t.shape[2:]), dtype=t.dtype, pin_memory=pin)
            for t in kv.slot_tensors
        ]
        self._pages = _Slots(page_slots)
        self._snaps = _Slots(snapshot_slots if states is not None else 0)
        # One buffer per tensor of a state row (recurrent, conv, the model's extras).
        self.snapshots = [] if states is None else [
            torch.empty((snapshot_slots, *t.shape), dtype=t.dtype, pin_memory=pin) for t in states.read_row(0)
        ]

    # -- queries -------------------------------------------------------------------------

    def has_page(self, key: bytes) -> bool:
        return key in self._pages.of

    def has_snapshot(self, key: bytes) -> bool:
        return key in self._snaps.of

    @property
    def num_pages(self) -> int:
        return len(self._pages.of)

    @property
    def num_snapshots(self) -> int:
        return len(self._snaps.of)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.pages) + sum(t.nbytes for t in self.snapshots)

    # -- locks ---------------------------------------------------------------------------

    def lock(self, keys: Sequence[bytes]) -> None:
        """Keep these keys (pages and snapshots) until `unlock`; locks count."""
        for key in keys:
            self._pages.locks[key] += 1
            self._snaps.locks[key] += 1

    def unlock(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            for slots in (self._pages, self._snaps):
                if slots.locks[key] <= 0:
                    raise ValueError(f"unlock of a host-tier key that is not locked: {key.hex()}")
                slots.locks[key] -= 1
                if not slots.locks[key]:
                    del slots.locks[key]

    # -- copies --------------------------------------------------------------------------

    def store_pages(self, keys: Sequence[bytes], pages: Sequence[int]) -> int:
        """Copy device `pages` out under `keys` (a key already held is only touched).
        Returns how many are held afterwards (fewer when every slot is locked)."""
        todo = [(key, page) for key, page in zip(keys, pages, strict=True) if self._pages.touch(key) is None]
        held = len(keys) - len(todo)
        if not todo:
            return held
        data = self.kv.read_pages([page for _, page in todo])  # each [L, n·ps, ...] on the device
        ps = self.kv.page_size
        for j, (key, _) in enumerate(todo):
            slot = self._pages.claim(key)
            if slot is None:
                break
            for buf, d in zip(self.pages, data, strict=True):
                buf[slot].copy_(d[:, j * ps : (j + 1) * ps], non_blocking=True)
            held += 1
        return held

    def load_pages(self, keys: Sequence[bytes], pages: Sequence[int]) -> None:
        """Copy the entries `keys` into device `pages` (every key must be held)."""
        slots = [self._pages.touch(key) for key in keys]
        if any(slot is None for slot in slots):
            raise KeyError("load of a host-tier page that is not held")
        device, data = self.kv.k.device, []
        for buf in self.pages:
            staged = torch.empty((len(slots), *buf.shape[1:]), dtype=buf.dtype, device=device)
            for j, slot in enumerate(slots):
                staged[j].copy_(buf[slot], non_blocking=True)  # NOTE: stream-ordered, no host read
            # [n, L, ps, ...] → [L, n·ps, ...]: pages in order, as read_pages gathers them
            data.append(staged.transpose(0, 1).reshape(buf.shape[1], -1, *buf.shape[3:]))
        self.kv.write_pages(list(pages), tuple(data))

    def store_snapshot(self, key: bytes, row: int) -> bool:
        """Copy state row `row` out under `key` (touched if held). False when no slot is free."""
        assert self.states is not None
        if self._snaps.touch(key) is not None:
            return True
        slot = self._snaps.claim(key)
        if slot is None:
            return False
        for buf, t in zip(self.snapshots, self.states.read_row(row), strict=True):
            buf[slot].copy_(t, non_blocking=True)
        return True

    def load_snapshot(self, key: bytes, row: int) -> None:
        """Copy the snapshot `key` into state row `row` (the key must be held)."""
        assert self.states is not None
        slot = self._snaps.touch(key)
        if slot is None:
            raise KeyError(f"load of a host-tier snapshot that is not held: {key.hex()}")
        for buf, t in zip(self.snapshots, self.states.read_row(row), strict=True):
            t.copy_(buf[slot], non_blocking=True)
