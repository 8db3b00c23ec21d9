"""Movers: how the device expert cache's misses reach their slots.

A mover takes a wave's miss list `[2, M]` (expert ids, destination slots; -1 padded,
`moe/device_cache.py`) and fills those slots of every part of the slot banks from the
host expert store, on the current stream, before the wave computes. Two ways:

- `GatherMover` (`gather`): a device kernel reads the missed experts' rows straight from
  the pinned host store, mapped into the device's address space (`moe/pinning.uva_view`,
  the PLE host store's mechanism), into the slots (`kernels/row_gather.gather_parts_into`,
  Triton on CUDA: every part of the wave's experts in one launch). It reads only the
  miss list, so it needs no host read and is captured in the decode graph; it takes SMs
  from compute while it runs. On a CPU it is the reference: an index copy from the store.
- `CopyEngineMover` (`copy`): the copy engine, as the host-cache path copies: the miss
  list is brought to the host (a wait per wave, overlapped with the hit pass), then one
  async copy per expert and part (`SlotBanks.copy_in`). Its addresses are fixed only at
  run time, so it runs eagerly.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

import torch

from edgemoe.kernels.backend import triton_importable
from edgemoe.kernels.gather_grid import GatherGrid
from edgemoe.kernels.row_gather import gather_parts_into
from edgemoe.moe.offload import RoutingReadback, SlotBanks
from edgemoe.moe.pinning import uva_view
from edgemoe.moe.store import BankStore, ExpertStore

log = logging.getLogger(__name__)

MOVERS = ("gather", "copy")


class ExpertMover(ABC):
    """Contract: `move(layer, misses)` issues, on the current stream, the copies that put
    expert `misses[0, i]` of `layer` into slot `misses[1, i]` of every part of the slot
    banks, for each i with `misses[0, i] >= 0`; compute issued after it sees them.
    `begin(misses)` (optional) may start bringing the list over before the caller's
    other work; `move` follows it with the same list. `graph_safe`: no host reads (may
    be captured). `two_pass`: the executor should compute the hits between `begin` and
    `move` (the mover waits for the host there). Used by one thread."""

    name: str
    graph_safe: bool = False
    two_pass: bool = False

    def begin(self, misses: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Start bringing the miss list where `move` needs it."""

    @abstractmethod
    def move(self, layer: int, misses: torch.Tensor, grid: GatherGrid | None = None) -> None:
        """`grid`: the gather's launch where the mover is a kernel (None: its default)."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A contiguous bank [N, ...] as rows of integers [N, D] over the same bytes, as wide as
    the row allows (the gather copies bits, not values: any dtype, fp8 included)."""
    rows = t.reshape(t.shape[0], -1).view(torch.uint8)
    for dtype in (torch.int32, torch.int16):
        if rows.shape[1] % dtype.itemsize == 0:
            return rows.view(dtype)
    return rows


class GatherMover(ExpertMover):
    """Device-side gather from the (mapped) store banks into the slot banks."""

    name = "gather"

    def __init__(self, store: BankStore, slots: SlotBanks) -> None:
        device = slots.device
        mapped = device.type == "cuda"
        # NOTE: mapped views alias the pinned banks and hold no reference: the store outlives us.
        self.dest = {name: _bits(bank) for name, bank in slots.parts.items()}
        self.tables: dict[int, dict[str, torch.Tensor]] = {}
        for layer in store.layers:
            host = {name: _bits(store.tensor(layer, name)) for name in self.dest}
            self.tables[layer] = {n: uva_view(t, device) for n, t in host.items()} if mapped else host
        self.graph_safe = not mapped or triton_importable()  # the reference reads the list back

    def move(self, layer: int, misses: torch.Tensor, grid: GatherGrid | None = None) -> None:
        tables = self.tables[layer]
        gather_parts_into(list(tables.values()), misses[0], [self.dest[n] for n in tables], misses[1], grid)


class CopyEngineMover(ExpertMover):
    """The copy engine, after a host read of the miss list."""

    name = "copy"
    two_pass = True

    def __init__(self, slots: SlotBanks) -> None:
        self.slots = slots
        self.readback = RoutingReadback(slots.device)

    def begin(self, misses: torch.Tensor) -> None:
        self.readback.start(misses)

    def move(self, layer: int, misses: torch.Tensor, grid: GatherGrid | None = None) -> None:
        host, _ = self.readback.wait()  # NOTE: the wave's one host read
        self.slots.copy_in(layer, [(int(e), int(s)) for e, s in zip(host[0], host[1], strict=True) if e >= 0])


def gatherable(store: ExpertStore, device: torch.device) -> bool:
    """Whether the gather mover can read `store`: stacked banks, page-locked on a GPU."""
    return isinstance(store, BankStore) and (device.type != "cuda" or bool(store.pinned))


def make_mover(name: str, store: ExpertStore, slots: SlotBanks) -> ExpertMover:
    """The mover `--expert-mover` names; `gather` falls back to the copy engine (logged)
    when the store can't be mapped (mmap views, or pinning refused)."""
    if name not in MOVERS:
        raise ValueError(f"expert_mover (--expert-mover) {name!r}: choose one of {', '.join(MOVERS)}")
    if name == "gather" and gatherable(store, slots.device):
        return GatherMover(store, slots)  # type: ignore[arg-type]
    if name == "gather":
        log.warning("expert mover: the store is not page-locked stacked banks (mmap, or pinning refused): "
                    "misses go through the copy engine, and decode steps are not captured in CUDA graphs")
    return CopyEngineMover(slots)
