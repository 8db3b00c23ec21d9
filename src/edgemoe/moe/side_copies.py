"""How a decode prefetch's copies run beside the chain (`moe/prefetch.py`): started after a
layer's plan, awaited before their own layer computes, a few layers later. Three ways, one
contract (`SideCopies`): `issue(buffer, layer, misses)` starts the copies of `misses` [2, M]
(ids, slots; -1 padded) of store layer `layer` after the stream's earlier work; `wait(buffer)`
makes the stream wait for them; `drain()` returns once everything issued has landed (after a
failed step). A buffer is issued again only after its wait.

- `SideGather` (`EDGEMOE_PREFETCH_MOVER=gather`, the default): the device gather on a side
  stream forked at the issue and joined at the wait (events; in a graph a fork and a join).
  Its programs read mapped host memory on SMs, beside the GEMVs.
- `EngineCopies` (`EDGEMOE_PREFETCH_MOVER=copy`): the copy engine, its copies issued by a C
  thread the graph rings (`kernels/copy_bell.py`): no SMs taken, nothing in the graph that
  holds an expert's address.
- `InlineCopies`: no GPU: the mover's copies in stream order (the CPU tests' path).
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import torch

from edgemoe.kernels.gather_grid import GatherGrid
from edgemoe.moe.movers import ExpertMover

log = logging.getLogger(__name__)

SIDE_MOVERS = ("gather", "copy")


class SideCopies(Protocol):
    name: str

    def issue(self, buffer: int, layer: int, misses: torch.Tensor) -> None: ...

    def wait(self, buffer: int) -> None: ...

    def drain(self) -> None: ...

    def snapshot(self) -> dict[str, object]: ...

    def close(self) -> None: ...


class InlineCopies:
    """The mover's copies on the stream itself (no side stream: a CPU)."""

    name = "inline"

    def __init__(self, mover: ExpertMover) -> None:
        self.mover = mover

    def issue(self, buffer: int, layer: int, misses: torch.Tensor) -> None:
        self.mover.move(layer, misses)

    def wait(self, buffer: int) -> None:
        pass

    def drain(self) -> None:
        pass

    def snapshot(self) -> dict[str, object]:
        return {"prefetch_mover": self.name}

    def close(self) -> None:
        pass


class SideGather:
    """The device gather (`mover`) on a side stream of priority `priority`, `grid` its launch;
    `buffers` events."""

    name = "gather"

    def __init__(self, mover: ExpertMover, buffers: int, device: torch.device, grid: GatherGrid, priority: int) -> None:
        self.mover, self.grid, self.device = mover, grid, device
        self._side = torch.cuda.Stream(device, priority=priority)
        self._landed = [torch.cuda.Event() for _ in range(buffers)]

    def issue(self, buffer: int, layer: int, misses: torch.Tensor) -> None:
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            self.mover.move(layer, misses, self.grid)
            self._landed[buffer].record(self._side)

    def wait(self, buffer: int) -> None:
        torch.cuda.current_stream(self.device).wait_event(self._landed[buffer])

    def drain(self) -> None:
        self._side.synchronize()

    def snapshot(self) -> dict[str, object]:
        return {"prefetch_mover": self.name, "prefetch_programs": self.grid.programs,
                "prefetch_tile": [self.grid.block, self.grid.warps]}

    def close(self) -> None:
        pass


class EngineCopies:
    """The copy engine through the copier (`kernels/copy_bell.CopyBell`), one row a buffer."""

    name = "copy"

    def __init__(self, bell) -> None:  # noqa: ANN001 - kernels/copy_bell.CopyBell
        self.bell = bell

    def issue(self, buffer: int, layer: int, misses: torch.Tensor) -> None:
        self.bell.ring(buffer, layer, misses)

    def wait(self, buffer: int) -> None:
        self.bell.wait(buffer)

    def drain(self) -> None:
        self.bell.drain()

    def snapshot(self) -> dict[str, object]:
        stats = self.bell.stats()
        rings = stats["rings"]
        return {"prefetch_mover": self.name, "copier_rings": rings, "copier_copies": stats["copies"],
                "copier_us_per_ring": stats["busy_ns"] / rings / 1e3 if rings else None,
                "copier_errors": stats["errors"]}

    def close(self) -> None:
        self.bell.close()


def side_mover() -> str:
    """`EDGEMOE_PREFETCH_MOVER`: gather (default) or copy."""
    name = os.environ.get("EDGEMOE_PREFETCH_MOVER", "") or "gather"
    if name not in SIDE_MOVERS:
        raise ValueError(f"EDGEMOE_PREFETCH_MOVER={name!r}: {' or '.join(SIDE_MOVERS)}")
    return name


def engine_copies(store, slots, buffers: int, width: int, device: torch.device) -> EngineCopies | None:  # noqa: ANN001
    """The copier over `store`'s banks (a page-locked `moe/store.BankStore`) and the slot
    banks `slots` (`moe/offload.SlotBanks`), or None where it can't run (logged)."""
    from edgemoe.kernels.copy_bell import CopyBell, copier_library
    from edgemoe.moe.movers import gatherable

    if not gatherable(store, device):
        log.warning("EDGEMOE_PREFETCH_MOVER=copy: the store is not page-locked banks: the gather moves prefetch")
        return None
    lib = copier_library()
    if lib is None:
        log.warning("EDGEMOE_PREFETCH_MOVER=copy: no C compiler for the copier: the gather moves prefetch")
        return None
    layers = list(store.layers)
    sources = [{name: store.tensor(layer, name) for name in slots.parts} for layer in layers]
    return EngineCopies(CopyBell(lib, layers, sources, slots.parts, buffers, width, device))
