"""How a decode prefetch's copies run beside the chain (`moe/prefetch.py`): started after a
layer's plan, awaited before their own layer computes, a few layers later. Three ways, one
contract (`SideCopies`): `issue(buffer, layer, misses)` starts the copies of `misses` [2, M]
(ids, slots; -1 padded) of store layer `layer` after the stream's earlier work; `wait(buffer)`
makes the stream wait for them; `drain()` returns once everything issued has landed (after a
failed step). A buffer is issued again only after its wait.

- `SideGather` (`--expert-mover gather`): the device gather on a side stream forked at the
  issue and joined at the wait (events; in a graph a fork and a join). Its programs read
  mapped host memory on SMs, beside the GEMVs.
- `EngineCopies` (`--expert-mover copy`): the copy engine, its copies issued by the copier's
  C thread, which the graph rings (`kernels/copy_bell.py`): no SMs taken, nothing in the
  graph that holds an expert's address. It shares the chain's copier (one thread, one copy
  stream: a layer's own misses queue ahead of the prefetches). `EDGEMOE_PREFETCH_MOVER=copy`
  beside `--expert-mover gather` gives prefetch a copier of its own (the A/B).
- `InlineCopies`: no GPU: the mover's copies in stream order (the CPU tests' path).
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import torch

from edgemoe.kernels.gather_grid import GatherGrid
from edgemoe.moe.movers import CHAIN_ROW, CopierMover, CopyEngineMover, ExpertMover, copier_for

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
    """The copy engine through the copier (`kernels/copy_bell.CopyBell`), one row a buffer,
    inside captured graphs; in eager steps the copies are made at the issue, after a host
    read of the list (moe/movers.CopierMover's note: a module load beside a wait deadlocks)."""

    name = "copy"

    def __init__(self, bell, owned: bool, slots) -> None:  # noqa: ANN001 - CopyBell, SlotBanks
        self.bell, self.owned = bell, owned  # owned: closed here (else the chain's mover's)
        self.eager = CopyEngineMover(slots)
        self._rung: set[int] = set()  # buffers rung and not yet awaited

    def issue(self, buffer: int, layer: int, misses: torch.Tensor) -> None:
        if not torch.cuda.is_current_stream_capturing():
            self.eager.copy_now(layer, misses)
            return
        self.bell.ring(buffer, layer, misses)
        self._rung.add(buffer)

    def wait(self, buffer: int) -> None:
        if buffer in self._rung:
            self._rung.discard(buffer)
            self.bell.wait(buffer)

    def drain(self) -> None:
        self.bell.drain()
        self._rung.clear()  # after a failed step (or capture): nothing awaited later

    def snapshot(self) -> dict[str, object]:
        stats = self.bell.stats()  # the chain's rings too where it shares the chain's copier
        rings = stats["rings"]
        return {"prefetch_mover": self.name, "copier_rings": rings, "copier_copies": stats["copies"],
                "copier_us_per_ring": stats["busy_ns"] / rings / 1e3 if rings else None,
                "copier_errors": stats["errors"]}

    def close(self) -> None:
        if self.owned:
            self.bell.close()


def side_mover(chain: ExpertMover) -> str:
    """How prefetch copies: as the chain moves its misses (`--expert-mover`), or as
    `EDGEMOE_PREFETCH_MOVER` says: `copy` beside a gathering chain (the A/B); `gather` beside
    the copier's chain is refused (the side gather runs the chain's own mover)."""
    chain_copies = isinstance(chain, CopierMover)
    name = os.environ.get("EDGEMOE_PREFETCH_MOVER", "") or ("copy" if chain_copies else "gather")
    if name not in SIDE_MOVERS:
        raise ValueError(f"EDGEMOE_PREFETCH_MOVER={name!r}: {' or '.join(SIDE_MOVERS)}")
    if name == "gather" and chain_copies:
        raise ValueError("EDGEMOE_PREFETCH_MOVER=gather: the chain moves by the copier (--expert-mover copy); "
                         "prefetch gathers beside --expert-mover gather only")
    return name


def engine_copies(chain: ExpertMover, store, slots, buffers: int) -> EngineCopies | None:  # noqa: ANN001
    """Prefetch's copies on the copy engine, `buffers` rows of the copier: the chain's own
    (`chain` a `CopierMover`: one thread and copy stream, the chain's row first), else one
    of its own over `store`'s banks and the slot banks `slots`; None where none can run
    (logged: the gather moves prefetch)."""
    if buffers > CHAIN_ROW:
        raise ValueError(f"prefetch: {buffers} buffers, the copier has {CHAIN_ROW}")
    bell = chain.bell if isinstance(chain, CopierMover) else copier_for(store, slots)
    if bell is None:
        log.warning("EDGEMOE_PREFETCH_MOVER=copy: no copier here (the log says why): the gather moves prefetch")
        return None
    return EngineCopies(bell, owned=not isinstance(chain, CopierMover), slots=slots)
