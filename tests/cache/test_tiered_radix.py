"""The tiered radix cache (GDN state snapshots, host tier) driven like the engine drives it,
by hypothesis, against what the content must be: every KV slot and state row is written
with a fingerprint of the token prefix it encodes, so a match (device, or revived from the
host tier) must hand back pages and a restored state whose fingerprints are those of the
prefix asked for. Every KV page and every snapshot row has exactly one owner at all times
(the free list, the tree, or one request): nothing leaks, nothing is freed twice; a
locked prefix is never evicted or overwritten."""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass, field

import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from edgemoe.cache.host_tier import HostTier
from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.prefix_cache import Snapshot
from edgemoe.cache.state_pool import StatePool, StateShape
from edgemoe.cache.tiered_radix import TieredRadixCache

PAGES, LIVE = 12, 2
SHAPE = StateShape(num_layers=1, num_v_heads=1, key_dim=1, value_dim=1, conv_channels=1, conv_history=1,
                   conv_dtype=torch.float32)
BASES = [tuple(range(10, 22)), tuple(range(10, 16)) + (50, 51, 52, 53), (7, 7, 7, 7, 7, 7, 7, 7)]


def fp(prefix: tuple[int, ...]) -> float:
    """A fingerprint of a token prefix, exact in fp32."""
    return float(zlib.crc32(array("q", prefix).tobytes()) % (1 << 20) + 1)


@dataclass
class Req:
    tokens: tuple[int, ...]
    pages: list[int]
    shared: int  # leading pages that came from the match (the cache's)
    computed: int
    handle: object
    row: int
    held: list[Snapshot] = field(default_factory=list)


class TieredMachine(RuleBasedStateMachine):
    @initialize(ps=st.sampled_from([1, 2]), snapshot_rows=st.integers(1, 4), host=st.booleans(),
                host_pages=st.integers(1, 8), host_snaps=st.integers(1, 3))
    def setup(self, ps: int, snapshot_rows: int, host: bool, host_pages: int, host_snaps: int) -> None:
        cpu = torch.device("cpu")
        self.ps = ps
        self.kv = KVPool(1, PAGES, ps, 1, 1, torch.float32, cpu)
        self.states = StatePool(SHAPE, LIVE + 1, snapshot_rows, cpu)
        tier = HostTier(self.kv, host_pages, self.states, host_snaps) if host else None
        self.cache = TieredRadixCache(ps, self.kv, self.states, tier)
        self.running: list[Req] = []

    # -- a request's life ----------------------------------------------------------------

    def admit(self, tokens: tuple[int, ...], row: int) -> Req:
        before = self.cache.total_pages
        m = self.cache.match(tokens[:-1])
        self.cache.lock(m.handle)
        if self.cache.total_pages > before:
            event("revived pages from the host tier")
        assert m.num_tokens % self.ps == 0 and (m.state_row is None) == (m.num_tokens == 0)
        self.check_pages(tokens, m.pages, m.num_tokens)
        self.states.recurrent[:, row], self.states.conv[:, row] = float("nan"), float("nan")
        self.cache.restore_state(m, row)
        event("hit" if m.num_tokens else "miss")
        if m.num_tokens:  # the snapshot restored is the state after exactly the matched prefix
            want = fp(tokens[: m.num_tokens])
            assert self.states.recurrent[0, row].item() == want and self.states.conv[0, row].item() == -want
        return Req(tokens, list(m.pages), len(m.pages), m.num_tokens, m.handle, row)

    def compute(self, req: Req, upto: int) -> bool:
        """Positions [computed, upto) in chunks ending on page boundaries, as the scheduler
        cuts them for a stateful cache; False if the pages run out."""
        need = self.kv.pages_for(upto) - len(req.pages)
        if need > self.kv.num_free:
            self.cache.evict(need - self.kv.num_free)
        if need > self.kv.num_free:
            return False
        req.pages += self.kv.alloc(max(0, need))
        ends = sorted({e for e in range(req.computed + 1, upto + 1) if e % self.ps == 0 or e == upto})
        for end in ends:
            for pos in range(req.computed, end):
                slot = req.pages[pos // self.ps] * self.ps + pos % self.ps
                self.kv.k[0, slot], self.kv.v[0, slot] = fp(req.tokens[: pos + 1]), -fp(req.tokens[: pos + 1])
            req.computed = end
            value = fp(req.tokens[:end])
            self.states.recurrent[:, req.row], self.states.conv[:, req.row] = value, -value
            self.cache.capture_state(req.held, req.row, end)
        return True

    def release(self, req: Req) -> None:
        if self.cache.host is not None and self.cache.host.num_pages:
            event("host tier holds pages")
        result = self.cache.insert(req.tokens[: req.computed], req.pages, req.held)
        self.kv.free(result.to_free)
        self.cache.unlock(req.handle)

    def check_pages(self, tokens: tuple[int, ...], pages: list[int], n: int) -> None:
        for pos in range(n):
            slot = pages[pos // self.ps] * self.ps + pos % self.ps
            assert self.kv.k[0, slot].item() == fp(tokens[: pos + 1]), f"wrong KV at {pos}"

    # -- rules ---------------------------------------------------------------------------

    tokens = st.tuples(st.sampled_from(BASES), st.integers(1, 12), st.lists(st.integers(1, 3), max_size=4)).map(
        lambda t: t[0][: t[1]] + tuple(t[2]))

    @rule(tokens=tokens, freeze=st.sampled_from([None, "prompt", "tool_call"]), at=st.integers(0, 10))
    def run(self, tokens: tuple[int, ...], freeze: str | None, at: int) -> None:
        """One whole request: admit, compute every token (freezing a snapshot on the way), release."""
        req = self.admit(tokens, LIVE - 1)
        mid = min(len(tokens), max(req.computed, at))
        if self.compute(req, mid) and freeze:
            self.cache.freeze_state(req.held, freeze)
        self.compute(req, len(tokens))
        self.release(req)

    @precondition(lambda self: len(self.running) < LIVE - 1)
    @rule(tokens=tokens, upto=st.integers(0, 16))
    def start(self, tokens: tuple[int, ...], upto: int) -> None:
        """A request that stays running (its match locked) across other rules."""
        req = self.admit(tokens, 0)
        self.compute(req, min(len(tokens), max(req.computed, upto)))
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule()
    def finish(self) -> None:
        self.release(self.running.pop())

    @rule(n=st.integers(1, PAGES))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def every_page_and_row_has_one_owner(self) -> None:
        if not hasattr(self, "cache"):
            return
        private = [p for r in self.running for p in r.pages[r.shared :]]
        owners = list(self.kv._free) + sorted(self.cache._owned) + private
        assert sorted(owners) == list(range(PAGES)), owners
        rows = list(self.states._free) + [n.snapshot for n in self.cache._nodes() if n.snapshot is not None]
        rows += [s.row for r in self.running for s in r.held]
        assert sorted(rows) == list(range(self.states.live_rows, self.states.num_rows)), rows

    @invariant()
    def running_prefixes_are_intact(self) -> None:
        for req in getattr(self, "running", []):
            self.cache._live(req.handle)  # raises if its locked prefix was evicted
            self.check_pages(req.tokens, req.pages, req.computed)


TestTieredRadix = TieredMachine.TestCase
TestTieredRadix.settings = settings(max_examples=80, stateful_step_count=25, deadline=None)
