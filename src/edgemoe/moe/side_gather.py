"""Copies into the device cache's slots on a side stream while the decode step goes on — decode
prefetch's mechanism (`moe/prefetch.py`), apart from what it predicts. Its owner plans the
copies on the stream (the cache's state is only ever touched there, in order) and hands the
miss list here:

- `buffers(p, n)`: the static miss list of buffer `p` (the side stream reads it after the
  plan wrote it) and its in-flight slot mask, which the owner marks;
- `start(layer, misses, p, join, grid)`: the side stream forks from the stream and gathers
  `layer`'s misses; the layer `join` must not compute before they land;
- `pins(layer, rows)`: what `layer`'s own plan may not evict (slots still being written);
- `join(layer)`: the stream waits for the copies `layer` needs, before it computes.

Two copies in flight at most (buffers by parity). On a CPU the copy is the stream's own.
One thread; `reset()` after a failed step.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.gather_grid import GatherGrid
from edgemoe.moe.cpu_share import ROWS  # the largest decode step a side copy serves
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import ExpertMover


class SideGather:
    """Side copies into `cache`'s slots by `mover`; `top_k` routed experts a token."""

    def __init__(self, cache: DeviceSlotCache, mover: ExpertMover, top_k: int) -> None:
        self.cache, self.mover, self.top_k = cache, mover, top_k
        device = cache.device
        cuda = device.type == "cuda"
        self._side = torch.cuda.Stream(device) if cuda else None
        self._landed = [torch.cuda.Event() if cuda else None for _ in range(2)]
        S, E = cache.num_slots, cache.num_experts
        width = min(ROWS * top_k, E, S)  # the longest miss list a covered step plans
        self._misses = torch.full((2, 2, width), -1, dtype=torch.int32, device=device)  # read by the side stream
        self._in_flight = torch.zeros(2, S, dtype=torch.bool, device=device)  # each copy's slots
        self._pending: dict[int, int] = {}  # the layer that joins -> the buffer of its copies

    def most(self, rows: int) -> int:
        """The most distinct experts a layer of `rows` token rows routes (or a side copy moves)."""
        return min(rows * self.top_k, self.cache.num_experts)

    def covers(self, rows: int) -> bool:
        """Whether a step of `rows` token rows may copy aside: a decode-sized step whose layer
        plans in one wave beside the slots in flight."""
        return 0 < rows <= ROWS and self.cache.num_slots >= 2 * self.most(rows)

    def buffers(self, p: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffer `p`'s miss list [2, n] (static: the side stream reads it later) and slot mask [S]."""
        return self._misses[p, :, :n], self._in_flight[p]

    def pins(self, layer: int, rows: int) -> tuple[torch.Tensor | None, int]:
        """The slots `layer`'s own plan may not evict (copies it waits for are writing them)
        and a bound on their number."""
        p = self._pending.get(layer)
        return (None, 0) if p is None else (self._in_flight[p], self.most(rows))

    def start(self, layer: int, misses: torch.Tensor, p: int, join: int, grid: GatherGrid) -> None:
        """Gather `layer`'s `misses` (buffer `p`'s) on the side stream; `join` waits for them."""
        self._pending[join] = p
        if self._side is None:
            self.mover.move(layer, misses)
            return
        self._side.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(self._side):
            self.mover.move(layer, misses, grid)
            self._landed[p].record(self._side)

    def join(self, layer: int) -> None:
        """Before `layer` computes: the stream waits for the copies it needs."""
        p = self._pending.pop(layer, None)
        if p is not None and self._side is not None:
            torch.cuda.current_stream(self.cache.device).wait_event(self._landed[p])

    def join_all(self) -> None:
        """Before a step that copies nothing aside touches the cache: nothing stays in flight."""
        for layer in list(self._pending):
            self.join(layer)

    def reset(self) -> None:
        """After a failed step: nothing in flight."""
        if self._side is not None:
            self._side.synchronize()
        self._pending.clear()

