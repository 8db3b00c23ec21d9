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
- `CopierMover` (`copy`, on a GPU with the CPU expert library and a page-locked store): the
  copy engine, its copies issued at run time by the copier's C thread, which a launch of the
  step rings with the miss list (`kernels/copy_bell.py`); the stream waits for its answer
  before the wave computes. Nothing in the step holds an expert's address, so it is captured
  in the decode graph too, and it takes no SMs. The decode prefetch shares its thread and
  copy stream (`moe/side_copies.py`): a layer's own misses first (its row is `urgent`), the
  prefetches behind.
- `CopyEngineMover` (`copy` elsewhere): the copy engine, as the host-cache path copies: the
  miss list is brought to the host (a wait per wave, overlapped with the hit pass), then
  one async copy per expert and part (`SlotBanks.copy_in`). Its addresses are fixed only
  at run time, so it runs eagerly.
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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop what the mover runs beside the process (the copier's thread)."""


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

    def copy_now(self, layer: int, misses: torch.Tensor) -> None:
        """`begin` and `move` at once: the list read, then copied (nothing to overlap)."""
        self.begin(misses)
        self.move(layer, misses)


class CopierMover(ExpertMover):
    """The copy engine through the copier (`bell`: `kernels/copy_bell.CopyBell`), its row
    `row`, in captured graphs: ring, then the stream waits. Eager steps (prompt chunks)
    read the list on the host and copy from this thread, as `CopyEngineMover` does.

    NOTE: an eager step is where new kernels load, and a module load waits for the context
    to go idle while holding the driver, so a stream waiting on the copier's answer and
    the copier's own driver calls deadlock it (measured, H100, 2026-12-07: Triton's first
    `moe_combine` of a prompt chunk). A graph's kernels were loaded at capture."""

    name = "copy"
    graph_safe = True

    def __init__(self, bell, row: int, slots: SlotBanks) -> None:  # noqa: ANN001 - kernels/copy_bell.CopyBell
        self.bell, self.row = bell, row
        self.eager = CopyEngineMover(slots)

    def move(self, layer: int, misses: torch.Tensor, grid: GatherGrid | None = None) -> None:
        if not torch.cuda.is_current_stream_capturing():
            self.eager.copy_now(layer, misses)
            return
        self.bell.ring(self.row, layer, misses)
        self.bell.wait(self.row)

    def close(self) -> None:
        self.bell.close()


# The copier's rows: a decode prefetch's buffers (depth + 1 <= 4, moe/prefetch.py), then
# the chain's own, looked at first.
COPIER_ROWS = 5
CHAIN_ROW = COPIER_ROWS - 1


def copier_for(store: ExpertStore, slots: SlotBanks):  # noqa: ANN201 - kernels/copy_bell.CopyBell | None
    """A copier over `store`'s banks and `slots`, or None where it can't run: no GPU, a
    store that isn't page-locked banks, a driver without stream memory operations in graphs,
    no C compiler for the library (the reason logged), or without `EDGEMOE_COPIER=1` (an
    experiment: a module loading while a graph waits on it deadlocks, CopierMover's note)."""
    from edgemoe.kernels.copy_bell import CopyBell, copier_library

    from edgemoe.env_switch import env_switch
    from edgemoe.kernels.cpu_bell import bell_supported

    if not env_switch("EDGEMOE_COPIER", False):  # opt-in: module loads beside its waits (CopierMover's note)
        return None
    if slots.device.type != "cuda" or not gatherable(store, slots.device):
        log.info("copier: needs a GPU and page-locked stacked banks")
        return None
    if not bell_supported(slots.device.index or 0):  # the same stream memory operations, probed once
        return None
    lib = copier_library()
    if lib is None:
        log.warning("copier: no C compiler for the CPU expert library")
        return None
    layers = list(store.layers)  # type: ignore[attr-defined]
    sources = [{name: store.tensor(layer, name) for name in slots.parts} for layer in layers]  # type: ignore[attr-defined]
    width = min(store.num_experts, next(iter(slots.parts.values())).shape[0])
    return CopyBell(lib, layers, sources, slots.parts, COPIER_ROWS, width, slots.device, urgent=CHAIN_ROW)


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
    elif (bell := copier_for(store, slots)) is not None:
        return CopierMover(bell, CHAIN_ROW, slots)
    return CopyEngineMover(slots)
