"""Decode prefetch (`--moe-prefetch on`, the device expert cache): during MoE layer l of a
decode step, predict layer l+1's experts and copy the predicted misses on a side stream,
so the copies run while layer l computes and while layer l+1's attention and router run
(issue 13, item 2). Without it a layer's copies wait for its own router: the chain
attention → router → plan → copy → compute is serial, and at 16 GiB the copies are most
of a decode step.

Per decode layer (`DeviceOffloadExecutor`, steps of at most `ROWS` tokens in one wave):
- `join(layer)` — before the layer plans (and before the CPU share reads the slot map):
  the stream waits for the prefetch launched at the layer before. NOTE: between a launch
  and its join only the side stream touches the cache's state (map, owners, recency,
  counts of the next layer); the main stream's work in between reads none of it.
- `launch(layer, ...)` — after the layer's own copies are issued, before its compute: the
  layer's input x and routed ids go to static buffers, then on the side stream: the
  predictor's ids for the next MoE layer; minus the misses the CPU share will take there
  (its quota's coldest by heat, the share's own rule), so the prefetch moves only what
  the GPU would have moved; the cache's plan of them for the next layer with this layer's
  slots pinned (nothing it still reads is evicted); the mover's gather of the plan's
  misses. The plan's hits are not counted (they are no use yet) and the layer's
  `wave_end` is kept (the scan-resistant policy dates the layer's cycle by real waves);
  its misses count as misses (they were copied).
The next layer then finds the predicted experts resident: its plan counts them as hits.

Predictors: `RouterPredictor` — the next layer's router on this layer's MoE input (the
input norms differ between layers: an approximation, the common one); `StagedPredictor`
— under `--routing synthetic`, the next layer's drawn ids: an oracle (recall 1), labelled
so, which shows what the mechanism saves at perfect prediction; neither says much about a
trained model's recall on random weights.

Statistics (device counters, read when asked): `prefetched` (experts copied by prefetch),
`prefetch_used` (of them, routed by their layer), with recall = used / (used + the
misses left to the step) and precision = used / prefetched.
"""

from __future__ import annotations

from typing import Protocol

import torch

from edgemoe.moe.cpu_share import ROWS  # the largest decode step that prefetches: the share's too
from edgemoe.moe.device_cache import DeviceSlotCache, present
from edgemoe.moe.movers import ExpertMover


class Predictor(Protocol):
    label: str

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[T, K] int32 ids predicted for MoE `layer` from the previous layer's input x [T, H];
        `like`: a [T, K] int32 tensor of -1 (the shape; padding rows' ids)."""
        ...


class RouterPredictor:
    """The next layer's router (softmax top-k, i.e. the logits' top-k) on x."""

    label = "router"

    def __init__(self, routers: dict[int, torch.Tensor], top_k: int) -> None:
        self.routers, self.top_k = routers, top_k

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        logits = torch.matmul(x, self.routers[layer].t()).float()
        return torch.topk(logits, self.top_k, dim=-1).indices.to(torch.int32)


class StagedPredictor:
    """Synthetic routing's drawn ids for the layer: an oracle (the step's draws are staged
    before its forward)."""

    label = "synthetic oracle"

    def __init__(self, routing) -> None:  # noqa: ANN001 - moe/synthetic_routing.SyntheticRouting
        self.routing = routing

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.routing.ids(layer, like).to(torch.int32)


def drop_cpu_picks(ids: torch.Tensor, resident: torch.Tensor, heat: torch.Tensor, quota: torch.Tensor) -> torch.Tensor:
    """ids [T, K] without the pairs of the `quota` coldest misses (lowest heat, ties to the
    higher id: `kernels/share_split.py`'s decode pick) against `resident` [E] (-1: not)."""
    E = heat.numel()
    flat = ids.reshape(-1).long()
    expert = torch.arange(E, device=ids.device)
    miss = present(ids, E) & (resident < 0)
    key = torch.where(miss, heat * E + (E - 1 - expert), torch.iinfo(torch.int64).max)
    rank = torch.empty_like(expert).scatter_(0, torch.argsort(key), expert)
    cpu = torch.cat((miss & (rank < quota), torch.zeros(1, dtype=torch.bool, device=ids.device)))
    return torch.where(cpu[torch.where(flat >= 0, flat, E)].view(ids.shape), -1, ids)


class DecodePrefetch:
    """Prefetch for the cache's MoE layers `layers` (ascending) by `mover`; x arrives in
    `dtype`; `share` (or None): the CPU share whose quota's picks are left to it. One thread;
    `reset()` after a failed step."""

    def __init__(self, cache: DeviceSlotCache, mover: ExpertMover, layers: list[int], predictor: Predictor,
                 hidden: int, top_k: int, dtype: torch.dtype, share=None) -> None:  # noqa: ANN001 - CpuShare
        self.cache, self.mover, self.predictor, self.share = cache, mover, predictor, share
        self.next_layer = dict(zip(layers, layers[1:], strict=False))
        device = cache.device
        self._side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._landed = torch.cuda.Event() if device.type == "cuda" else None
        self._x = torch.zeros(ROWS, hidden, dtype=dtype, device=device)
        self._ids = torch.full((ROWS, top_k), -1, dtype=torch.int32, device=device)
        self._slots = torch.full((ROWS, top_k), -1, dtype=torch.int32, device=device)
        E = cache.num_experts
        self._loaded = torch.zeros(E, dtype=torch.bool, device=device)  # the latest prefetch's experts
        self.counts = torch.zeros(cache.num_layers, 2, dtype=torch.int64, device=device)  # prefetched, used
        self._pending: int | None = None  # the layer whose prefetch is in flight (not yet joined)
        self._loaded_for: int | None = None  # the layer `_loaded` marks experts of

    def covers(self, rows: int, waves: int) -> bool:
        return 0 < rows <= ROWS and waves == 1

    def join(self) -> None:
        """The stream waits for the prefetch in flight, if any."""
        if self._pending is not None and self._side is not None:
            torch.cuda.current_stream(self.cache.device).wait_event(self._landed)
        self._pending = None

    def launch(self, layer: int, x: torch.Tensor, routed: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """Count what the last prefetch gave `layer`, then predict and copy the next MoE
        layer's experts (after the last layer: only the count, on this stream)."""
        nxt, counted = self.next_layer.get(layer), self._loaded_for == layer
        self._loaded_for = nxt
        if nxt is None:
            if counted:
                self._count_used(layer, routed)
            return
        # NOTE: the side stream reads only static buffers (and the cache's own tensors): what
        # this stream allocates may be reused as soon as it is freed here.
        T = x.shape[0]
        self._x[:T].copy_(x)
        self._ids[:T].copy_(routed)
        self._slots[:T].copy_(slot_ids)
        if self._side is None:
            self._side_work(layer if counted else None, nxt, T)
        else:
            self._side.wait_stream(torch.cuda.current_stream(self.cache.device))
            with torch.cuda.stream(self._side):
                self._side_work(layer if counted else None, nxt, T)
                self._landed.record(self._side)
        self._pending = nxt

    def reset(self) -> None:
        """After a failed step: nothing in flight, nothing to count."""
        if self._side is not None:
            self._side.synchronize()
        self._pending = self._loaded_for = None

    def snapshot(self) -> dict[str, object]:
        """The counters (one device read) and the predictor's label."""
        prefetched, used = (int(v) for v in self.counts.sum(0).tolist())
        return {"prefetch": self.predictor.label, "prefetched": prefetched, "prefetch_used": used,
                "prefetch_precision": used / prefetched if prefetched else None}

    # ---- internals -------------------------------------------------------------------

    def _side_work(self, counted: int | None, nxt: int, T: int) -> None:
        pinned = present(self._slots[:T], self.cache.num_slots)  # this layer's slots: it still reads them
        if counted is not None:
            self._count_used(counted, self._ids[:T])
        like = torch.full((T, self._ids.shape[1]), -1, dtype=torch.int32, device=self._ids.device)
        ids = self.predictor(nxt, self._x[:T], like)
        if self.share is not None:
            ids = drop_cpu_picks(ids, self.cache.slot_map[nxt], self.share.heat[nxt], self.share.quota[nxt])
        self._plan_and_move(nxt, ids, pinned)

    def _plan_and_move(self, nxt: int, ids: torch.Tensor, pinned: torch.Tensor) -> None:
        """The cache's plan of `ids` for layer `nxt`, counted as copies only, and its gather."""
        cache, E = self.cache, self.cache.num_experts
        counts, wave_end = cache.counts[nxt].clone(), cache.wave_end[nxt].clone()
        plan = cache.plan_wave(nxt, ids, pinned)
        copied = cache.counts[nxt, 1] - counts[1]
        cache.counts[nxt].copy_(torch.stack((counts[0], counts[1] + copied)))  # its hits are no use yet
        cache.wave_end[nxt].copy_(wave_end)  # the scan-resistant policy dates cycles by real waves
        self.counts[nxt, 0] += copied
        self._loaded.copy_(present(plan.misses[0], E))
        self.mover.move(nxt, plan.misses)

    def _count_used(self, layer: int, routed: torch.Tensor) -> None:
        """Of the experts prefetched for `layer`, those it routed."""
        E = self.cache.num_experts
        self.counts[layer, 1] += (present(routed, E) & self._loaded).sum()
