"""Decode prefetch (`--moe-prefetch on`, the device expert cache): during MoE layer l of a
decode step, predict layer l+1's experts, plan them into the cache and start their copies
on a side stream, so the copies run while layer l waits for its own, computes, and while
layer l+1's attention and router run (issue 13, item 2). Without it a layer's copies wait
for its own router: the chain attention → router → plan → copy → compute is serial, and at
16 GiB the copies are most of a decode step. With an exact prediction the link never
waits for the chain: layer l+1's copies queue right behind layer l's.

Per decode layer l (`DeviceOffloadExecutor`, steps of at most `ROWS` token rows whose
layer plans in one wave with the in-flight slots pinned: `covers`):
- l's own plan pins the slots l's prefetch is still filling (`pins`): a mispredicted
  expert's slot is being written and may not be handed to a miss;
- after l's own misses are issued, `launch(l, ...)` on the stream: the predictor's ids for
  the next MoE layer, minus the misses the CPU share will take there when it runs in this
  step (its quota's coldest by heat, the share's own rule; at that layer the share counts
  the prefetch's copies as the misses they were, `CpuShare.begin`'s `prefetched`), planned
  `ahead` (`DeviceSlotCache.plan_wave`: the same decisions and updates, hits not counted,
  the layer's cycle not advanced) with l's slots pinned; the miss list goes to a static
  buffer, and the side stream, forked there, gathers it;
- `join(l)`: the stream waits for the copies of l's own prefetch (launched one layer
  earlier) — just before l computes, not before it plans.
Everything that touches the cache's state runs on the stream, in order; the side stream
only copies. A slot it is still writing is pinned by its layer's own plan; the next
prefetch may reuse a misprediction's slot, but its copy queues behind on the same stream.
At depth 1 two prefetches are in flight at most (buffers and events by a layer's position mod 2). A step that doesn't
prefetch joins everything in flight first (`join_all`).

Depth (`prefetch_depth`: 3 where the pool holds four layers' worth of the largest step's
experts, else 2 or 1; `EDGEMOE_PREFETCH_DEPTH` sets it): with one layer of lookahead layer
l+2's copies cannot start before layer l+1 has planned, so a layer with few misses leaves
the link idle while the chain runs (`scripts/prefetch_model.py` reproduces the measured steps
so). At depth d layer l starts layer l+d's copies (the first layer the next d's), planned
with l's slots and the in-flight slots of the layers between pinned; each layer's own plan
pins the in-flight slots of every layer still pending; d + 1 prefetches are in flight at
most (buffers and events by a layer's position mod d + 1), and a step prefetches only where
the slots hold d + 1 layers' worth (`covers`). The router predictor then ranks layer l+d's
experts on l's input, a weaker guess than one layer ahead (unmeasured on a trained model).

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

import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from edgemoe.kernels.prefetch_marks import prefetch_marks, prefetch_pins
from edgemoe.kernels.gather_grid import BLOCK_INTO, GatherGrid
from edgemoe.kernels.tile_override import override
from edgemoe.moe.cpu_share import ROWS  # the largest decode step that prefetches: the share's too
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import ExpertMover
from edgemoe.moe.predictors import Predictor
from edgemoe.moe.side_copies import InlineCopies, SideCopies, SideGather, side_mover


# The side stream's gather grid. The decode step's default (4 programs a multiprocessor,
# ~4 MB of host reads in flight) slowed the expert GEMVs running beside it ~20x on an H200
# (2026-12-02 profile: 316 µs a call against 15); the link needs ~100 KB in flight
# (52 GB/s x ~2 µs), so a few dozen programs keep it busy. EDGEMOE_PREFETCH_PROGRAMS and
# EDGEMOE_PREFETCH_TILE ("block,warps": a work item's columns, a program's warps): A/B.
DEFAULT_PROGRAMS = 32
DEFAULT_PRIORITY = "normal"
DEFAULT_DEPTH = 3  # layers ahead where the pool holds depth + 1 layers' worth (`prefetch_depth`)


class GatherTile(NamedTuple):
    block: int = BLOCK_INTO  # a work item's columns
    warps: int = 4  # a program's warps


def side_priority() -> int:
    """The side stream's priority (torch's: lower is higher; 0 is the default streams'). A
    captured graph keeps each kernel's stream priority (torch instantiates graphs with
    `cudaGraphInstantiateFlagUseNodePriority`), so a high-priority side gather's programs are
    placed ahead of the expert GEMVs' waiting ones as the SMs free up, instead of after their
    whole grids. EDGEMOE_PREFETCH_PRIORITY=high|normal: A/B."""
    value = os.environ.get("EDGEMOE_PREFETCH_PRIORITY", "") or DEFAULT_PRIORITY
    if value not in ("high", "normal"):
        raise ValueError(f"EDGEMOE_PREFETCH_PRIORITY={value!r}: high or normal")
    return -1 if value == "high" else 0


def prefetch_depth(slots: int, step_experts: int) -> int:
    """How many MoE layers ahead a decode step's copies start. With one layer of lookahead
    layer l+2's copies wait for layer l+1's plan, so a layer with few misses leaves the link
    idle while the chain runs; at depth d layer l starts layer l+d's. Measured on an H100
    (fp8, 16 GiB, the oracle, 2026-12-07): 144.3 / 158.5 / 164.1 tok/s at depth 1 / 2 / 3,
    as `scripts/prefetch_model.py --depth` predicted. A step prefetches only where the pool
    holds depth + 1 layers' worth of its experts (`covers`), so by default the depth is the
    deepest up to DEFAULT_DEPTH whose depth + 1 layers of the largest prefetching step's
    experts (`step_experts`) fit in `slots`, at least 1. EDGEMOE_PREFETCH_DEPTH=1|2|3 sets it."""
    raw = os.environ.get("EDGEMOE_PREFETCH_DEPTH", "")
    if raw:
        if raw not in ("1", "2", "3"):
            raise ValueError(f"EDGEMOE_PREFETCH_DEPTH={raw!r}: 1, 2 or 3 layers ahead")
        return int(raw)
    return next((d for d in range(DEFAULT_DEPTH, 1, -1) if (d + 1) * step_experts <= slots), 1)


def prefetch_grid() -> GatherGrid:
    """The side gather's launch: the defaults, or the environment's A/B settings."""
    programs = os.environ.get("EDGEMOE_PREFETCH_PROGRAMS", "") or str(DEFAULT_PROGRAMS)
    if not programs.isdigit() or int(programs) < 1:
        raise ValueError(f"EDGEMOE_PREFETCH_PROGRAMS={programs!r}: a positive number of programs")
    tile = override("EDGEMOE_PREFETCH_TILE", GatherTile(), {2}, "block,warps, e.g. 8192,8", ("block", "warps"))
    if tile.warps > 32:
        raise ValueError(f"EDGEMOE_PREFETCH_TILE: {tile.warps} warps (a program has at most 32)")
    return GatherGrid(int(programs), block=tile.block, warps=tile.warps)


class DecodePrefetch:
    """Prefetch for the cache's MoE layers `layers` (ascending) by `mover`; `top_k` routed
    experts a token; `depth` (default: `prefetch_depth`'s for this pool): how many MoE layers
    ahead the copies start. One thread; `reset()` after a failed step."""

    def __init__(self, cache: DeviceSlotCache, mover: ExpertMover, layers: list[int], predictor: Predictor,
                 top_k: int, depth: int | None = None,
                 engine: Callable[[int], SideCopies | None] | None = None) -> None:
        self.cache, self.mover, self.predictor, self.top_k = cache, mover, predictor, top_k
        self.depth = prefetch_depth(cache.num_slots, self._experts(ROWS)) if depth is None else depth
        self.targets = {layer: layers[i + 1:i + 1 + self.depth] if i == 0 else layers[i + self.depth:i + self.depth + 1]
                        for i, layer in enumerate(layers)}  # the layers whose copies start at each
        predictor.prepare([(source, target) for source, targets in self.targets.items() for target in targets])
        self.grid = prefetch_grid()
        B = self.depth + 1  # prefetches in flight at most
        self.buffer = {layer: i % B for i, layer in enumerate(layers)}
        device = cache.device
        S, E = cache.num_slots, cache.num_experts
        width = min(ROWS * top_k, E, S)  # the longest miss list a covered step plans
        self.copies = self._side_copies(mover, B, engine)
        self._misses = torch.full((B, 2, width), -1, dtype=torch.int32, device=device)  # read by the side stream
        self._in_flight = torch.zeros(B, S, dtype=torch.bool, device=device)  # each prefetch's slots
        self._loaded = torch.zeros(B, E, dtype=torch.bool, device=device)  # each prefetch's experts
        self._pins = torch.zeros(S, dtype=torch.bool, device=device)  # the planned layer's slots
        self._union = torch.zeros(2, S, dtype=torch.bool, device=device)  # several prefetches' slots (depth > 1)
        self._like = torch.full((ROWS, top_k), -1, dtype=torch.int32, device=device)  # the predictors' shape
        self._scratch = torch.zeros(E, dtype=torch.int32, device=device)  # the share's picks, by expert
        self.counts = torch.zeros(cache.num_layers, 2, dtype=torch.int64, device=device)  # prefetched, used
        self._pending: set[int] = set()  # layers whose prefetch is in flight (not yet joined)
        self._counting: set[int] = set()  # layers whose `_loaded` row marks their prefetched experts

    def _side_copies(self, mover: ExpertMover, buffers: int,
                     engine: Callable[[int], SideCopies | None] | None) -> SideCopies:
        """How the copies run beside the chain (`moe/side_copies.py`): `engine(buffers)` (the
        copier's copy engine) where the chain's mover or EDGEMOE_PREFETCH_MOVER says copy and
        it can run, else the gather on a side stream; on a CPU in stream order."""
        device = self.cache.device
        if device.type != "cuda":
            return InlineCopies(mover)
        if side_mover(mover) == "copy" and engine is not None and (copies := engine(buffers)) is not None:
            return copies
        return SideGather(mover, buffers, device, self.grid, side_priority())

    def covers(self, rows: int) -> bool:
        """Whether a step of `rows` token rows prefetches: a decode-sized step whose layer
        plans in one wave with the in-flight slots of the layers ahead pinned."""
        return 0 < rows <= ROWS and self.cache.num_slots >= (self.depth + 1) * self._experts(rows)

    def pins(self, layer: int, rows: int) -> tuple[torch.Tensor | None, int]:
        """The slots `layer`'s own plan may not evict: those its prefetch and the prefetches
        of the layers after it are still filling (a mispredicted expert's slot is being
        written), and a bound on their number."""
        pending = [p for p in self._pending if p >= layer]
        if not pending:
            return None, 0
        return self._slots_of(pending, None, 0), len(pending) * self._experts(rows)

    def _slots_of(self, layers: list[int], base: torch.Tensor | None, row: int) -> torch.Tensor:
        """The in-flight slots of `layers`' prefetches (and `base`'s), as one mask: one of
        them as it is, several or'ed into `_union[row]` (one launch each)."""
        masks = ([] if base is None else [base]) + [self._in_flight[self.buffer[p]] for p in layers]
        if len(masks) == 1:
            return masks[0]
        out = self._union[row]
        torch.logical_or(masks[0], masks[1], out=out)
        for mask in masks[2:]:
            out |= mask
        return out

    def loaded(self, layer: int) -> torch.Tensor | None:
        """[E] bool: the experts `layer`'s prefetch copied for this step (before its launch
        counts them), or None where none was started for it."""
        return self._loaded[self.buffer[layer]] if layer in self._counting else None

    def _experts(self, rows: int) -> int:
        """The most distinct experts a layer of `rows` token rows routes (or a prefetch copies)."""
        return min(rows * self.top_k, self.cache.num_experts)

    def launch(self, layer: int, x: torch.Tensor, routed: torch.Tensor, slot_ids: torch.Tensor,
               share=None) -> None:  # noqa: ANN001 - CpuShare
        """After `layer`'s own copies are issued: count what its prefetch gave it, predict
        the experts of the layers whose copies start here (the next MoE layer, or `depth`
        ahead) from x, plan them ahead with `layer`'s slots and the layers in flight between
        pinned, and copy the misses on the side stream (after the last: only the count).
        `share`: the CPU share when it runs in this step (its quota's picks are left to it),
        else None: then no pick is dropped, and no launch on the chain asks which (a live
        quota's level-0 graphs ran ~20 small launches a layer here, 1.7 ms a step at fp8)."""
        counted = layer in self._counting
        targets = self.targets[layer]
        if not targets and not counted:
            return
        used = (routed, self._loaded[self.buffer[layer]], self.counts[layer, 1]) if counted else (None, None, None)
        self._counting.discard(layer)
        prefetch_pins(slot_ids, self._pins, *used)  # after the last layer: the count alone
        for target in targets:
            between = [p for p in self._pending if layer < p < target]
            self._start(target, x, self._slots_of(between, self._pins, 1), share, layer)

    def _start(self, layer: int, x: torch.Tensor, pinned: torch.Tensor, share, source: int) -> None:  # noqa: ANN001
        """`layer`'s predicted experts (without `share`'s picks, if any) planned ahead with
        `pinned` slots kept, the misses marked and copied on the side stream."""
        ids = self.predictor(layer, x, self._like[: x.shape[0]], source)
        if share is not None:
            ids = share.drop_picks(layer, ids, self.cache.slot_map[layer], self._scratch)
        plan = self.cache.plan_wave(layer, ids, pinned, ahead=True)
        b = self.buffer[layer]
        misses = self._misses[b, :, : plan.misses.shape[1]]  # NOTE: static: the side stream reads it later
        prefetch_marks(plan.misses, misses, self._in_flight[b], self._loaded[b], self.counts[layer, 0])
        self._pending.add(layer)
        self._counting.add(layer)
        self.copies.issue(b, layer, misses)

    def join(self, layer: int) -> None:
        """Before `layer` computes: the stream waits for the copies its prefetch started."""
        if layer in self._pending:
            self._pending.discard(layer)
            self.copies.wait(self.buffer[layer])

    def after_move(self, layer: int, x: torch.Tensor, routed: torch.Tensor, slot_ids: torch.Tensor,
                   share=None) -> None:  # noqa: ANN001 - CpuShare
        """What runs once `layer`'s misses are moved: the next layer's copies start before
        this layer waits for its own (`share`: as `launch`'s)."""
        self.launch(layer, x, routed, slot_ids, share)
        self.join(layer)

    def join_all(self) -> None:
        """Before a step that doesn't prefetch touches the cache: nothing stays in flight."""
        for layer in list(self._pending):
            self.join(layer)

    def reset(self) -> None:
        """After a failed step: nothing in flight, nothing to count."""
        self.copies.drain()
        self._pending.clear()
        self._counting.clear()

    def close(self) -> None:
        """Stops what runs beside the chain (the copier's thread), nothing in flight first."""
        self.reset()
        self.copies.close()

    def snapshot(self) -> dict[str, object]:
        """The counters (one device read) and the predictor's label."""
        prefetched, used = (int(v) for v in self.counts.sum(0).tolist())
        return {"prefetch": self.predictor.label, "prefetched": prefetched, "prefetch_used": used,
                "prefetch_precision": used / prefetched if prefetched else None,
                "prefetch_depth": self.depth, **self.copies.snapshot()}
