"""The CPU share's picks loaded into the device cache after their layer (`EDGEMOE_SHARE_ADMIT=1`;
off by default until the GPU machine has measured it: docs/offload.md, "The share's picks
loaded after their layer").

The share computes a layer's coldest misses on the CPU and, as an admission filter, never
loads them, so they miss again at their next use: at fp8 the share's best fraction misses
67.9 experts a token where LRU misses 52.7. Here, once a decode layer's own copies and
compute are issued, the experts the CPU took are planned into the cache (`plan_wave(...,
ahead=True)`: LRU's decisions, the slot map updated on the stream) and copied on a side
stream (`moe/side_gather.py`, as decode prefetch copies) by a small gather grid (`prefetch_grid`, a few dozen programs beside the next layer's
work), so the link carries them while the chain runs and the cache keeps LRU's hit rate
(`scripts/split_miss_model.py`'s `whole` rule: fp8 8.35 → 6.42 ms a step in the model).

Per decode layer l (steps the share takes, of at most `ROWS` token rows planning in one wave):
- `launch(l, routed, device_ids)` after l's waves: the CPU's experts are `routed` minus
  `device_ids` (the share's split); planned ahead, their miss list written to a static
  buffer the side stream reads, their slots marked in flight;
- the next MoE layer's own plan pins those slots (`pins`): they are being written;
- `join(next)`: the stream waits for the copies before that layer computes.
The last MoE layer loads nothing (the step would wait for its copies). Everything that
touches the cache's state runs on the stream, in order; the side stream only copies. Not
combined with decode prefetch (`--moe-prefetch on`): one side gather at a time.

The admitted copies count as the cache's misses (they are copies over the link), so a step's
misses are the device's, the CPU's, and these; `share_admitted` counts them apart.
"""

from __future__ import annotations

import os

import torch

from edgemoe.kernels.prefetch_marks import prefetch_marks
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import ExpertMover
from edgemoe.moe.prefetch import prefetch_grid
from edgemoe.moe.side_gather import SideCopier, SideGather


def admission_wanted() -> bool:
    """`EDGEMOE_SHARE_ADMIT`: "1" loads the share's picks after their layer, "0" (default) not."""
    raw = os.environ.get("EDGEMOE_SHARE_ADMIT", "0")
    if raw not in ("0", "1"):
        raise ValueError(f"EDGEMOE_SHARE_ADMIT={raw!r}: 0 or 1")
    return raw == "1"


class ShareAdmission(SideCopier):
    """Loads the CPU share's picks of the cache's MoE layers `layers` (ascending) by `mover`
    after their layer; `top_k` routed experts a token. One thread; `reset()` after a failed step."""

    def __init__(self, cache: DeviceSlotCache, mover: ExpertMover, layers: list[int], top_k: int) -> None:
        self.cache = cache
        self.next_layer = dict(zip(layers, layers[1:], strict=False))
        self.grid = prefetch_grid()
        self.parity = {layer: i % 2 for i, layer in enumerate(layers)}
        self.side = SideGather(cache, mover, top_k)
        self._experts = torch.zeros(cache.num_experts, dtype=torch.bool, device=cache.device)  # marks' scratch: unread
        self.admitted = torch.zeros(cache.num_layers, dtype=torch.int64, device=cache.device)

    def launch(self, layer: int, routed: torch.Tensor, device_ids: torch.Tensor) -> None:
        """After `layer`'s waves are issued: plan the experts the CPU took (`routed` [T, K]
        without the padding rows, less `device_ids`, the share's device routing) into the
        cache and copy them on the side stream; the next MoE layer joins them."""
        nxt = self.next_layer.get(layer)
        if nxt is None:
            return
        plan = self.cache.plan_wave(layer, torch.where(device_ids < 0, routed, -1), ahead=True)
        p = self.parity[layer]
        misses, in_flight = self.side.buffers(p, plan.misses.shape[1])
        prefetch_marks(plan.misses, misses, in_flight, self._experts, self.admitted[layer])
        self.side.start(layer, misses, p, nxt, self.grid)

    def reset(self) -> None:
        """After a failed step: nothing in flight."""
        self.side.reset()

    def snapshot(self) -> dict[str, object]:
        """The counter (one device read)."""
        return {"share_admitted": int(self.admitted.sum().item()), "share_admit_programs": self.grid.programs}
