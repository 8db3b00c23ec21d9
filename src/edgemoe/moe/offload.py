"""Offload: a global pool of device slots caches experts; misses are copied in.

Per MoE layer: (1) the routing starts its way to the host; (2) the experts already
resident run at once, their slots read from the device mirror of the slot map, so the
hit path never waits for the host; (3) the host reads the routing (the one device→host
read of the layer), `SlotCache` plans the misses in waves (a layer whose routed set
exceeds the pool runs wave by wave), each wave's misses are copied into their slots
and computed. Passes are masks over one routing (`kernels/moe_experts.py`), so the
result is bitwise the resident one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from edgemoe.kernels.moe_experts import Activation, moe_combine
from edgemoe.kernels.moe_quant import moe_slots_parts
from edgemoe.moe.activity import HIT, MISS
from edgemoe.moe.executor import CellWorkspace, MoEExecutor
from edgemoe.moe.lendable_memory import LendableBuffer
from edgemoe.moe.slots import LayerWave, SlotCache
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import ExpertStore
from edgemoe.quant import expert_specs


class SlotBanks:
    """Device banks [S, ...] of every part of the store's format (unquantised: gate_up
    [S, 2I, H] and down [S, H, I]), filled from the store.

    Copies are issued on the current stream (so compute that follows sees them);
    from pinned host memory they run on the copy engine asynchronously.

    `lend_slots`: the last slots' memory can be lent (`moe/lendable_memory.py`, each bank's
    tail; `release_tail` / `map_tail`, `tail_bytes` freed by a loan) — the caller empties
    those slots first (`moe/slot_lending.py`).
    """

    def __init__(self, store: ExpertStore, num_slots: int, device: torch.device, stats: MoEStats,
                 lend_slots: int = 0) -> None:
        self.store, self.device, self.stats = store, device, stats
        self.format = store.format
        hidden, inter = store.down_shape
        self._lendable: list[LendableBuffer] = []
        self.parts = {name: self._bank(num_slots, shape, dt, lend_slots)
                      for name, (shape, dt) in expert_specs(self.format, hidden, inter).items()}
        self.gate_up, self.down = self.parts["gate_up"], self.parts["down"]  # the data parts
        self.expert_nbytes = store.expert_nbytes
        self._timed = device.type == "cuda"

    def load(self, layer: int, wave: LayerWave) -> None:
        self.copy_in(layer, [(miss.expert, miss.slot) for miss in wave.misses])
        self.stats.bytes_copied += len(wave.misses) * self.expert_nbytes

    def copy_in(self, layer: int, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy each (expert, slot) of `layer` from the store into its slot, timed (not counted)."""
        if not pairs:
            return
        start = torch.cuda.Event(enable_timing=True) if self._timed else None
        if start is not None:
            start.record()
        for expert, slot in pairs:
            for name, t in self.store.expert_parts(layer, expert).items():
                self.parts[name][slot].copy_(t, non_blocking=True)
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.stats.add_copy_interval(start, end)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.parts.values())

    def _bank(self, num_slots: int, shape: tuple[int, ...], dt: torch.dtype, lend_slots: int) -> torch.Tensor:
        if not lend_slots:
            return torch.empty((num_slots, *shape), dtype=dt, device=self.device)
        slot = math.prod(shape) * dt.itemsize
        buf = LendableBuffer(num_slots * slot, (num_slots - lend_slots) * slot, self.device)
        self._lendable.append(buf)
        return buf.tensor.view(dt).view(num_slots, *shape)

    @property
    def outside_allocator(self) -> int:
        """Bytes the banks hold mapped outside torch's caching allocator (its statistics
        leave them out), a lent tail not counted."""
        return sum(b.outside_allocator for b in self._lendable)

    @property
    def tail_bytes(self) -> int:
        """Bytes a loan of the last slots gives back (0: nothing can be lent)."""
        return sum(b.tail_bytes for b in self._lendable)

    def release_tail(self) -> None:
        for b in self._lendable:
            b.release_tail()

    def map_tail(self) -> None:
        for b in self._lendable:
            b.map_tail()


class RoutingReadback:
    """Brings a layer's routing (and, for CPU experts, its activations) to the host
    without stalling the stream: copies into pinned buffers and an event; `wait()`
    blocks only until the routing exists, not until later work finishes. (The device
    cache's copy-engine mover brings its miss lists over the same way.)"""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._ids: torch.Tensor | None = None
        self._x: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None

    def start(self, topk_ids: torch.Tensor, x: torch.Tensor | None = None) -> None:
        if not self.cuda:
            self._ids, self._x = topk_ids, x
            return
        self._ids = _pinned_copy(self._ids, topk_ids)
        self._x = _pinned_copy(self._x, x) if x is not None else None
        self._event = torch.cuda.Event()
        self._event.record()

    def wait(self) -> tuple[np.ndarray, torch.Tensor | None]:
        """(routing [T, K] as numpy, x on the host or None)."""
        if self._event is not None:
            self._event.synchronize()  # NOTE: the layer's one host read
        assert self._ids is not None
        return self._ids.numpy(), self._x


def _pinned_copy(buf: torch.Tensor | None, src: torch.Tensor) -> torch.Tensor:
    """Copy `src` into a reused pinned buffer (grown when too small); returns the view."""
    n = src.numel()
    if buf is None or buf.dtype != src.dtype or buf.untyped_storage().nbytes() < n * src.element_size():
        buf = torch.empty(max(n, 4096), dtype=src.dtype, pin_memory=True)
    flat = torch.empty(0, dtype=src.dtype).set_(buf.untyped_storage(), 0, (n,))
    flat.copy_(src.flatten(), non_blocking=True)
    return flat.view(src.shape)


def real_rows(x, topk_ids, topk_weights, residual, num_padding: int):  # noqa: ANN001, ANN201
    """Drop the padding rows: they would route (and load) experts nobody needs. The
    caller's output keeps its padded length (see `pad_rows`)."""
    if not num_padding:
        return x, topk_ids, topk_weights, residual
    n = x.shape[0] - num_padding
    return x[:n], topk_ids[:n], topk_weights[:n], None if residual is None else residual[:n]


def pad_rows(out: torch.Tensor, num_padding: int) -> torch.Tensor:
    """`out` [n, H] back to the padded batch's length (padding rows: zeros)."""
    if not num_padding:
        return out
    return torch.cat([out, out.new_zeros(num_padding, out.shape[1])])


class OffloadExecutor(MoEExecutor):
    def __init__(
        self,
        store: ExpertStore,
        device: torch.device,
        act: Activation,
        num_layers: int,
        num_slots: int,
        policy: str = "lru",
        max_tokens: int = 256,
    ) -> None:
        self.act, self.device, self.num_experts = act, device, store.num_experts
        self.stats = MoEStats(num_layers, first_layer=store.layers[0])
        self.cache = SlotCache(num_slots, num_layers, store.num_experts, policy)
        self.stats.info.update(expert_policy=self.cache.policy.name)
        self.slots = SlotBanks(store, num_slots, device, self.stats)
        self.workspace = CellWorkspace(max_tokens, store.down_shape[0], device)
        self.readback = RoutingReadback(device)
        self.num_decode = 0  # of the layer being computed
        self._bias: dict[str, object] = {}  # its expert biases' arguments (`bias_args`)
        # The device mirror of the slot map (on the CPU: the map itself).
        self.slot_map = self.cache.slot_map.to(device)
        self._mirrored = self.cache.map_version

    def forward(self, layer, x, topk_ids, topk_weights, residual=None, num_decode=0, num_padding=0):  # type: ignore[override]
        x, topk_ids, topk_weights, residual = real_rows(x, topk_ids, topk_weights, residual, num_padding)
        self.stats.count_tokens(layer, x.shape[0])
        self.num_decode, self._bias = num_decode, self.bias_args(layer, topk_ids)
        cells = self.workspace.cells(topk_ids)
        self.readback.start(topk_ids)
        self.compute_hits(layer, x, topk_ids, topk_weights, cells)
        ids, _ = self.readback.wait()
        self.run_misses(layer, np.unique(ids).tolist(), x, topk_ids, topk_weights, cells)
        return pad_rows(moe_combine(cells, x.dtype, residual), num_padding)

    def _compute(self, x, slot_ids, topk_weights, cells) -> None:  # noqa: ANN001
        moe_slots_parts(x, slot_ids, topk_weights, self.slots.parts, self.slots.format, self.act, cells, self.num_decode,
                        **self._bias)

    def compute_hits(self, layer: int, x, topk_ids, topk_weights, cells) -> None:  # noqa: ANN001
        """The experts resident before this layer, from the device map (no host read)."""
        self._compute(x, self.slot_map[layer][topk_ids], topk_weights, cells)  # -1 = not resident

    def run_misses(
        self, layer: int, experts: Sequence[int], x, topk_ids, topk_weights, cells  # noqa: ANN001
    ) -> None:
        """Plan `experts` of `layer` in the slot cache; load and compute the misses wave
        by wave (the hits ran in `compute_hits`)."""
        with self.cache.layer_waves(layer, experts) as waves:
            for wave in waves:
                self.stats.hits[layer] += wave.num_hits
                self.stats.misses[layer] += len(wave.misses)
                if self.stats.activity is not None:  # someone watches the live view
                    self.stats.activity.mark(layer, wave.hits, HIT)
                    self.stats.activity.mark(layer, [m.expert for m in wave.misses], MISS)
                if not wave.misses:
                    continue
                with self.profiler.region("moe/copy"):
                    self.slots.load(layer, wave)
                lookup = self._lookup({m.expert: m.slot for m in wave.misses})
                self._compute(x, lookup[topk_ids], topk_weights, cells)
        self.mirror_map()

    def _lookup(self, slot_of: dict[int, int]) -> torch.Tensor:
        """Expert id → slot for this pass, -1 for every other expert ([E] int32)."""
        host = np.full(self.num_experts, -1, dtype=np.int32)
        host[list(slot_of)] = list(slot_of.values())
        return torch.from_numpy(host).to(self.device, non_blocking=True)

    def mirror_map(self) -> None:
        """Refresh the device slot map after the host cache changed (stream-ordered:
        the next layer's hit pass sees it)."""
        if self.cache.map_version != self._mirrored and self.slot_map is not self.cache.slot_map:
            self.slot_map.copy_(self.cache.slot_map, non_blocking=True)
        self._mirrored = self.cache.map_version

    def resident_mask(self) -> np.ndarray:
        return self.cache.slot_map.numpy() >= 0

    def recover(self) -> None:
        # A layer aborted between plan and release leaves its experts pinned; copies
        # that never landed would leave slots mapped to stale weights, so drop them all.
        self.cache.clear()
        self.mirror_map()

    def close(self) -> None:
        del self.slots
