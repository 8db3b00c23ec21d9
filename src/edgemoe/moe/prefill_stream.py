"""Streamed prefill: a long prompt chunk reads every MoE layer's experts through a double
buffer lent by the slot pool, each layer's copy running on the copy engine while the
layer before it computes (issue 13's routing-aware prefill, for chunks that route
nearly everywhere).

Why: a chunk of a thousand tokens or more routes to nearly every expert of every layer
(8K tokens of Qwen3-30B-A3B: 119 of 128 a layer), so the device cache's per-layer path —
plan, gather the misses, compute — moves almost a whole layer and then computes, in
series, and the gather takes SMs from compute. Streaming moves what the cache doesn't
hold of layer l+1 while layer l computes; a chunk then costs about its copies alone.

How (per chunk, decided at its first MoE layer; `DeviceOffloadExecutor` asks `covers`):
- the cache lends 2·E slots (free ones first, then the least recent;
  `DeviceSlotCache.lend`), and its map is read once: the chunk's one host wait;
- buffer b = the MoE layer's position mod 2; layer l's experts the cache doesn't hold
  are copied into buffer b's slot for each expert (one async copy per expert and part,
  `SlotBanks.copy_in`) on a copy stream, after the compute that last read buffer b;
- layer l's pairs read their expert's cache slot when it has one, else its buffer slot;
  its compute waits for its copy's event only.
The chunk changes nothing in the cache but the lent slots, which come back free: a long
prompt doesn't flush the decode working set, and the decode steps after it refill them.
Counting: a streamed layer's copied experts are its misses (routed or not: they were
moved), its routed resident experts its hits.

NOTE: valid only while nothing else changes the cache during the chunk: the executor
plans no waves (decode rows in the same step read the same table) and the CPU share
takes no pairs (every expert is on the device).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from edgemoe.kernels.slot_plan import present
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.offload import SlotBanks
from edgemoe.moe.store import ExpertStore

# A chunk with at least this many prompt tokens streams (its layers route nearly every
# expert: 1,024 tokens x 8 experts is 64 pairs an expert of 128). Overridden by
# EDGEMOE_PREFILL_STREAM_TOKENS (0 turns streaming off), for the A/B in docs/benchmarks.md.
DEFAULT_MIN_TOKENS = 1024


def stream_min_tokens() -> int:
    raw = os.environ.get("EDGEMOE_PREFILL_STREAM_TOKENS", "")
    try:
        return int(raw) if raw else DEFAULT_MIN_TOKENS
    except ValueError:
        raise ValueError(f"EDGEMOE_PREFILL_STREAM_TOKENS={raw!r}: a token count (0 turns streaming off)") from None


class PrefillStream:
    """Streams the chunks of `min_tokens` prompt rows or more (0: never) through 2·E
    slots lent by `cache` from those below `below` (default all: the rest may be lent to
    the chunk's activations, `moe/slot_lending.py`; never when fewer than 2·E). Used by the
    executor's one thread; `reset()` after a failed step."""

    def __init__(self, cache: DeviceSlotCache, slots: SlotBanks, store: ExpertStore, min_tokens: int,
                 below: int | None = None) -> None:
        self.cache, self.slots, self.store = cache, slots, store
        self.layers = list(store.layers)
        self.position = {layer: i for i, layer in enumerate(self.layers)}
        E = store.num_experts
        self.below = cache.num_slots if below is None else below
        self.min_tokens = min_tokens if self.below >= 2 * E else 0
        self.device = cache.device
        cuda = self.device.type == "cuda"
        self._copies = torch.cuda.Stream(self.device) if cuda else None
        self._copied = [torch.cuda.Event() for _ in range(2)] if cuda else []  # buffer b's latest copy landed
        self._computed = [torch.cuda.Event() for _ in range(2)] if cuda else []  # buffer b's latest reader done
        self.active = False
        self.chunks = 0  # chunks streamed so far (the executor's statistics show it)
        self._table: torch.Tensor | None = None  # [moe layers, E] int32: each expert's slot for the chunk
        self._missing: list[list[int]] = []  # per MoE layer: the experts copied into its buffer
        self._buffers = np.zeros((2, 0), dtype=np.int64)  # [2, E]: the lent slots, buffer by buffer

    def covers(self, layer: int, prompt_rows: int) -> bool:
        """Whether `layer` of this step streams; the step's first MoE layer decides (and
        starts the chunk), the others follow it."""
        if layer == self.layers[0]:
            self.active = (0 < self.min_tokens <= prompt_rows and not _capturing(self.device))
            if self.active:
                self._begin()
        return self.active

    def slot_ids(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        """[T, K] int32: each routed pair's slot for this chunk (-1 where not routed), the
        layer's copy awaited on the current stream and its hits counted."""
        i = self.position[layer]
        if self._copies is not None:
            torch.cuda.current_stream(self.device).wait_event(self._copied[i % 2])
        assert self._table is not None
        flat = ids.long()
        slots = torch.where(flat >= 0, self._table[i][flat.clamp(min=0)], -1)
        self._count(layer, i, flat)
        return slots.to(torch.int32)

    def computed(self, layer: int) -> None:
        """The layer's compute is issued: its buffer is free once that finishes, so the
        copy of the MoE layer two ahead goes into it; the chunk ends at the last layer."""
        i = self.position[layer]
        if self._copies is not None:
            self._computed[i % 2].record(torch.cuda.current_stream(self.device))
        if i + 2 < len(self.layers):
            self._copy(i + 2)
        if i == len(self.layers) - 1:
            self.active = False

    def reset(self) -> None:
        """After a failed step: no chunk in flight, the copy stream drained."""
        self.active = False
        if self._copies is not None:
            self._copies.synchronize()

    # ---- internals ----------------------------------------------------------------

    def _begin(self) -> None:
        self.chunks += 1
        E = self.store.num_experts
        lent = self.cache.lend(2 * E, self.below)
        # NOTE: the chunk's one host wait: which experts the cache holds, after the loan.
        resident = self.cache.slot_map[self.layers].cpu().numpy()
        buffers = lent.cpu().numpy().reshape(2, E)
        table = np.where(resident >= 0, resident, buffers[np.arange(len(self.layers)) % 2])
        self._table = torch.from_numpy(table.astype(np.int32)).to(self.device)
        self._missing = [np.flatnonzero(row < 0).tolist() for row in resident]
        self._buffers = buffers
        if self._copies is not None:  # the loan's updates and every earlier read of those slots first
            self._copies.wait_stream(torch.cuda.current_stream(self.device))
        for i in range(min(2, len(self.layers))):
            self._copy(i)

    def _copy(self, i: int) -> None:
        """Copy MoE layer i's missing experts into buffer i mod 2, after its last reader."""
        layer, b = self.layers[i], i % 2
        pairs = [(e, int(self._buffers[b][e])) for e in self._missing[i]]
        if self._copies is None:
            self.slots.copy_in(layer, pairs)
            return
        with torch.cuda.stream(self._copies):
            if i >= 2:
                self._copies.wait_event(self._computed[b])
            self.slots.copy_in(layer, pairs)
            self._copied[b].record(self._copies)

    def _count(self, layer: int, i: int, flat: torch.Tensor) -> None:
        """Hits: routed experts the cache holds; misses: the experts copied (on the device,
        read lazily with the cache's own counts)."""
        held = self.cache.slot_map[layer] >= 0
        hits = (present(flat, self.store.num_experts) & held).sum()
        misses = torch.full_like(hits, len(self._missing[i]))
        self.cache.counts[layer].add_(torch.stack((hits, misses)))


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
