"""The CPU share's picks loaded into the device cache after their layer (`EDGEMOE_SHARE_ADMIT=N`,
N ≥ 1 the lag below; off by default until the GPU machine has measured it: docs/offload.md,
"The share's picks loaded after their layer").

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
  `device_ids` (the share's split); planned ahead beside the loads still in flight (their
  slots pinned), their miss list written to ring buffer l mod N, whose previous list has
  landed, and the pool's in-flight mask updated (`kernels/prefetch_marks.ring_marks`);
- every MoE layer's own plan pins that mask (`pins`): those slots are being written (the
  mask holds this step's last N lists at most: emptied after the last layer, which joins all);
- `join(l + N)` (the last MoE layer at most): the stream waits for the copies before that
  layer computes. N = 1 joins at the next layer; a larger lag leaves a load more of the
  chain's idle link (N loads in flight, N lists pinned).
The last MoE layer loads nothing (the step would wait for its copies). Everything that
touches the cache's state runs on the stream, in order; the side stream only copies. Not
combined with decode prefetch (`--moe-prefetch on`): one side gather at a time.

The admitted copies count as the cache's misses (they are copies over the link), so a step's
misses are the device's, the CPU's, and these; `share_admitted` counts them apart.
"""

from __future__ import annotations

import logging
import os

import torch

from edgemoe.kernels.prefetch_marks import ring_marks
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import ExpertMover
from edgemoe.moe.prefetch import prefetch_grid
from edgemoe.moe.side_gather import SideCopier, SideGather


log = logging.getLogger(__name__)
MAX_LAG = 8


def admission_lag() -> int:
    """`EDGEMOE_SHARE_ADMIT`: "0" (default) loads nothing; N in 1..MAX_LAG loads the share's
    picks after their layer, joined N MoE layers later."""
    raw = os.environ.get("EDGEMOE_SHARE_ADMIT", "0")
    if not raw.isdigit() or int(raw) > MAX_LAG:
        raise ValueError(f"EDGEMOE_SHARE_ADMIT={raw!r}: 0 (off) or the MoE layers a load has before it is "
                         f"joined, 1 to {MAX_LAG}")
    return int(raw)


def make_admission(cache: DeviceSlotCache, mover: ExpertMover, layers: list[int], top_k: int,
                   has_share: bool) -> ShareAdmission | None:
    """The loads `EDGEMOE_SHARE_ADMIT` asks for, where a CPU share runs and the mover is a
    kernel that can copy on a side stream; else None (said in the log when asked for)."""
    lag = admission_lag()
    if not lag:
        return None
    if not has_share or not mover.graph_safe:
        log.warning("EDGEMOE_SHARE_ADMIT=%d: no CPU share, or the %s mover can't copy on a side stream: "
                    "nothing is loaded after its layer", lag, mover.name)
        return None
    return ShareAdmission(cache, mover, layers, top_k, lag)


class ShareAdmission(SideCopier):
    """Loads the CPU share's picks of the cache's MoE layers `layers` (ascending) by `mover`
    after their layer, each joined `lag` MoE layers later; `top_k` routed experts a token.
    One thread; `reset()` after a failed step."""

    def __init__(self, cache: DeviceSlotCache, mover: ExpertMover, layers: list[int], top_k: int,
                 lag: int = 1) -> None:
        self.cache, self.lag = cache, lag
        last = len(layers) - 1
        self.join_layer = {layer: layers[min(i + lag, last)] for i, layer in enumerate(layers[:-1])}
        self.ring_of = {layer: i % lag for i, layer in enumerate(layers)}
        self.grid = prefetch_grid()
        self.side = SideGather(cache, mover, top_k, buffers=lag, in_flight=lag)
        self.union = torch.zeros(cache.num_slots, dtype=torch.bool, device=cache.device)  # every load's slots
        self.admitted = torch.zeros(cache.num_layers, dtype=torch.int64, device=cache.device)

    def launch(self, layer: int, routed: torch.Tensor, device_ids: torch.Tensor) -> None:
        """After `layer`'s waves are issued: plan the experts the CPU took (`routed` [T, K]
        without the padding rows, less `device_ids`, the share's device routing) into the
        cache beside the loads in flight and copy them on the side stream. After the last
        layer (which joined every load): the mask and the lists start the next step empty."""
        join = self.join_layer.get(layer)
        if join is None:
            self._clear()
            return
        plan = self.cache.plan_wave(layer, torch.where(device_ids < 0, routed, -1), self.union, ahead=True)
        p = self.ring_of[layer]
        ring_marks(plan.misses, self.side.ring(p), self.union, self.admitted[layer])
        self.side.start(layer, self.side.ring(p)[:, : plan.misses.shape[1]], p, join, self.grid)

    def pins(self, layer: int, rows: int) -> tuple[torch.Tensor | None, int]:
        """Every plan pins the loads' slots: this step's last `lag` lists at most (a landed
        list leaves the mask when its buffer takes the next; the mask is empty at a step's start)."""
        return self.union, self.lag * self.side.most(rows)

    def _clear(self) -> None:
        self.union.zero_()
        self.side.ring(slice(None)).fill_(-1)

    def reset(self) -> None:
        """After a failed step: nothing in flight, nothing pinned."""
        self.side.reset()
        self._clear()

    def snapshot(self) -> dict[str, object]:
        """The counter (one device read)."""
        return {"share_admitted": int(self.admitted.sum().item()), "share_admit_programs": self.grid.programs,
                "share_admit_lag": self.lag}
