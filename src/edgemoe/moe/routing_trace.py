"""Recording a run's routing, as the slot cache sees it, for replays (`moe/replay.py`).

`RoutingTrace` is the observer an executor carries (`MoEExecutor.trace`): while
recording, every MoE layer's routed ids are kept (a device tensor each; nothing is read
back until `stop()`, so recording adds no host synchronisation); `stop()` turns them into
the access sequence the cache planned: one (layer, distinct experts ascending) per MoE
layer per step, in order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class Access(NamedTuple):
    """One layer's routed set in one step: what `SlotCache.plan_layer` is given."""

    layer: int
    experts: tuple[int, ...]


class RoutingTrace:
    def __init__(self) -> None:
        self.recording = False
        self._ids: list[tuple[int, torch.Tensor]] = []

    def start(self) -> None:
        self._ids.clear()
        self.recording = True

    def record(self, layer: int, ids: torch.Tensor) -> None:
        if self.recording:
            self._ids.append((layer, ids.detach().clone()))  # the router may reuse its buffers

    def stop(self) -> list[Access]:
        """Stop recording; the accesses in call order (one host read for all of them)."""
        self.recording = False
        recorded, self._ids = self._ids, []
        if not recorded:
            return []
        flat = torch.cat([ids.flatten() for _, ids in recorded]).cpu().numpy()
        out, at = [], 0
        for layer, ids in recorded:
            n = ids.numel()
            out.append(Access(layer, tuple(int(e) for e in np.unique(flat[at : at + n]))))
            at += n
        return out
