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
  the next MoE layer, minus the misses the CPU share will take there (its quota's coldest
  by heat, the share's own rule), planned `ahead` (`DeviceSlotCache.plan_wave`: the same
  decisions and updates, hits not counted, the layer's cycle not advanced) with l's slots
  pinned; the miss list goes to a static buffer, and the side stream, forked there, gathers it;
- `join(l)`: the stream waits for the copies of l's own prefetch (launched one layer
  earlier) — just before l computes, not before it plans.
Everything that touches the cache's state runs on the stream, in order; the side stream
only copies. A slot it is still writing is pinned by its layer's own plan; the next
prefetch may reuse a misprediction's slot, but its copy queues behind on the same stream.
Two prefetches are in flight at most (buffers and events by layer parity). A step that doesn't
prefetch joins everything in flight first (`join_all`).

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
from typing import NamedTuple, Protocol

import torch

from edgemoe.kernels.prefetch_marks import prefetch_marks, prefetch_pins
from edgemoe.kernels.router import fused_router_workspace, route_logits_topk
from edgemoe.kernels.gather_grid import BLOCK_INTO, GatherGrid
from edgemoe.kernels.share_split import coldest_of
from edgemoe.kernels.share_state import FRACTION_ONE
from edgemoe.kernels.slot_plan import present
from edgemoe.kernels.tile_override import override
from edgemoe.moe.cpu_share import ROWS  # the largest decode step that prefetches: the share's too
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.movers import ExpertMover


# The side stream's gather grid. The decode step's default (4 programs a multiprocessor,
# ~4 MB of host reads in flight) slowed the expert GEMVs running beside it ~20x on an H200
# (2026-12-02 profile: 316 µs a call against 15); the link needs ~100 KB in flight
# (52 GB/s x ~2 µs), so a few dozen programs keep it busy. EDGEMOE_PREFETCH_PROGRAMS and
# EDGEMOE_PREFETCH_TILE ("block,warps": a work item's columns, a program's warps): A/B.
DEFAULT_PROGRAMS = 32
DEFAULT_PRIORITY = "normal"


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


def prefetch_grid() -> GatherGrid:
    """The side gather's launch: the defaults, or the environment's A/B settings."""
    programs = os.environ.get("EDGEMOE_PREFETCH_PROGRAMS", "") or str(DEFAULT_PROGRAMS)
    if not programs.isdigit() or int(programs) < 1:
        raise ValueError(f"EDGEMOE_PREFETCH_PROGRAMS={programs!r}: a positive number of programs")
    tile = override("EDGEMOE_PREFETCH_TILE", GatherTile(), {2}, "block,warps, e.g. 8192,8", ("block", "warps"))
    if tile.warps > 32:
        raise ValueError(f"EDGEMOE_PREFETCH_TILE: {tile.warps} warps (a program has at most 32)")
    return GatherGrid(int(programs), block=tile.block, warps=tile.warps)


class Predictor(Protocol):
    label: str

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[T, K] int32 ids predicted for MoE `layer` from the previous layer's input x [T, H];
        `like`: a [T, K] int32 tensor of -1 (the shape; padding rows' ids)."""
        ...


class RouterScores(NamedTuple):
    """How a layer's router ranks its experts, for prediction: the logits x·Wᵀ (a softmax
    router's top-k is theirs), plus gpt-oss's logit `bias`; or, `sigmoid`, GLM's scores
    sigmoid(x·Wᵀ) plus its selection bias (its expert groups left out: one in GLM-4.5); or,
    `softmax`, ERNIE's softmax(x·Wᵀ) plus its selection bias (a bias on probabilities
    reorders what the logits alone would pick)."""

    weight: torch.Tensor  # [E, H]
    bias: torch.Tensor | None = None  # [E]
    sigmoid: bool = False
    softmax: bool = False

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(x.to(self.weight.dtype), self.weight.t()).float()
        s = s.sigmoid() if self.sigmoid else s.softmax(-1) if self.softmax else s
        return s if self.bias is None else s + self.bias.float()


class RouterPredictor:
    """The next layer's router on x: its experts' top-k by `RouterScores` (a plain weight
    [E, H]: the logits'). Where the ranking is the logits' (plus a logit bias: gpt-oss) and
    the fused router runs (CUDA, bf16/fp16), one `_route_fused` launch on a workspace of the
    predictor's own — the torch form's projection, cast, top-k and cast are four launches on
    the decode chain a layer; a softmax's top-k is its logits'."""

    label = "router"

    def __init__(self, routers: dict[int, RouterScores | torch.Tensor], top_k: int) -> None:
        self.routers, self.top_k = routers, top_k
        first = next(iter(routers.values()), None)  # NOTE: allocated now, never inside a graph's capture
        weight = first.weight if isinstance(first, RouterScores) else first
        self.workspace = None if weight is None else fused_router_workspace(weight, top_k)

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        router = self.routers[layer]
        router = router if isinstance(router, RouterScores) else RouterScores(router)
        if self.workspace is not None and not (router.sigmoid or router.softmax):
            w = router.weight
            bias = None if router.bias is None else router.bias.to(w.dtype)
            return route_logits_topk(x.to(w.dtype), w, self.top_k, False, w.dtype, self.workspace, bias=bias)[0]
        return torch.topk(router.scores(x), self.top_k, dim=-1).indices.to(torch.int32)


class StagedPredictor:
    """Synthetic routing's drawn ids for the layer: an oracle (the step's draws are staged
    before its forward)."""

    label = "synthetic oracle"

    def __init__(self, routing) -> None:  # noqa: ANN001 - moe/synthetic_routing.SyntheticRouting
        self.routing = routing

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.routing.real_ids(layer, like).to(torch.int32)  # padding rows: like's -1


def drop_cpu_picks(ids: torch.Tensor, resident: torch.Tensor, heat: torch.Tensor, quota: torch.Tensor,
                   fraction: torch.Tensor | int = FRACTION_ONE) -> torch.Tensor:
    """ids [T, K] without the pairs of the decode pick's misses against `resident` [E]
    (-1: not): `kernels/share_split.coldest_of`, the heat left as it is."""
    E = heat.numel()
    flat = ids.reshape(-1).long()
    cpu = coldest_of(present(ids, E) & (resident < 0), heat, quota, fraction)
    cpu = torch.cat((cpu, torch.zeros(1, dtype=torch.bool, device=ids.device)))
    return torch.where(cpu[torch.where(flat >= 0, flat, E)].view(ids.shape), -1, ids)


class DecodePrefetch:
    """Prefetch for the cache's MoE layers `layers` (ascending) by `mover`; `top_k` routed
    experts a token; `share` (or None): the CPU share whose quota's picks are left to it.
    One thread; `reset()` after a failed step."""

    def __init__(self, cache: DeviceSlotCache, mover: ExpertMover, layers: list[int], predictor: Predictor,
                 top_k: int, share=None) -> None:  # noqa: ANN001 - CpuShare
        self.cache, self.mover, self.predictor, self.share, self.top_k = cache, mover, predictor, share, top_k
        self.next_layer = dict(zip(layers, layers[1:], strict=False))
        self.grid = prefetch_grid()
        self.parity = {layer: i % 2 for i, layer in enumerate(layers)}  # two prefetches in flight at most
        device = cache.device
        cuda = device.type == "cuda"
        self._side = torch.cuda.Stream(device, priority=side_priority()) if cuda else None
        self._landed = [torch.cuda.Event() if cuda else None for _ in range(2)]
        S, E = cache.num_slots, cache.num_experts
        width = min(ROWS * top_k, E, S)  # the longest miss list a covered step plans
        self._misses = torch.full((2, 2, width), -1, dtype=torch.int32, device=device)  # read by the side stream
        self._in_flight = torch.zeros(2, S, dtype=torch.bool, device=device)  # each prefetch's slots
        self._loaded = torch.zeros(E, dtype=torch.bool, device=device)  # the latest prefetch's experts
        self._pins = torch.zeros(S, dtype=torch.bool, device=device)  # the planned layer's slots
        self._like = torch.full((ROWS, top_k), -1, dtype=torch.int32, device=device)  # the predictors' shape
        self.counts = torch.zeros(cache.num_layers, 2, dtype=torch.int64, device=device)  # prefetched, used
        self._pending: set[int] = set()  # layers whose prefetch is in flight (not yet joined)
        self._loaded_for: int | None = None  # the layer `_loaded` marks experts of

    def covers(self, rows: int) -> bool:
        """Whether a step of `rows` token rows prefetches: a decode-sized step whose layer
        plans in one wave with the next layer's in-flight slots pinned."""
        return 0 < rows <= ROWS and self.cache.num_slots >= 2 * self._experts(rows)

    def pins(self, layer: int, rows: int) -> tuple[torch.Tensor | None, int]:
        """The slots `layer`'s own plan may not evict: those its prefetch is still filling
        (a mispredicted expert's slot is being written), and a bound on their number."""
        if layer not in self._pending:
            return None, 0
        return self._in_flight[self.parity[layer]], self._experts(rows)

    def _experts(self, rows: int) -> int:
        """The most distinct experts a layer of `rows` token rows routes (or a prefetch copies)."""
        return min(rows * self.top_k, self.cache.num_experts)

    def launch(self, layer: int, x: torch.Tensor, routed: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """After `layer`'s own copies are issued: count what its prefetch gave it, predict
        the next MoE layer's experts from x, plan them ahead with `layer`'s slots pinned,
        and copy the misses on the side stream (after the last layer: only the count)."""
        counted = self._loaded_for == layer
        nxt = self._loaded_for = self.next_layer.get(layer)
        if nxt is None and not counted:
            return
        used = (routed, self._loaded, self.counts[layer, 1]) if counted else (None, None, None)
        prefetch_pins(slot_ids, self._pins, *used)  # after the last layer: the count alone
        if nxt is None:
            return
        ids = self.predictor(nxt, x, self._like[: x.shape[0]])
        if self.share is not None:
            ids = drop_cpu_picks(ids, self.cache.slot_map[nxt], self.share.heat[nxt], self.share.quota[nxt],
                                 self.share.fraction)
        plan = self.cache.plan_wave(nxt, ids, self._pins, ahead=True)
        p = self.parity[nxt]
        misses = self._misses[p, :, : plan.misses.shape[1]]  # NOTE: static: the side stream reads it later
        prefetch_marks(plan.misses, misses, self._in_flight[p], self._loaded, self.counts[nxt, 0])
        self._pending.add(nxt)
        if self._side is None:
            self.mover.move(nxt, misses)
            return
        self._side.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(self._side):
            self.mover.move(nxt, misses, self.grid)
            self._landed[p].record(self._side)

    def join(self, layer: int) -> None:
        """Before `layer` computes: the stream waits for the copies its prefetch started."""
        if layer in self._pending:
            self._pending.discard(layer)
            if self._side is not None:
                torch.cuda.current_stream(self.cache.device).wait_event(self._landed[self.parity[layer]])

    def after_move(self, layer: int, x: torch.Tensor, routed: torch.Tensor, slot_ids: torch.Tensor) -> None:
        """What runs once `layer`'s misses are moved: the next layer's copies start before
        this layer waits for its own."""
        self.launch(layer, x, routed, slot_ids)
        self.join(layer)

    def join_all(self) -> None:
        """Before a step that doesn't prefetch touches the cache: nothing stays in flight."""
        for layer in list(self._pending):
            self.join(layer)

    def reset(self) -> None:
        """After a failed step: nothing in flight, nothing to count."""
        if self._side is not None:
            self._side.synchronize()
        self._pending.clear()
        self._loaded_for = None

    def snapshot(self) -> dict[str, object]:
        """The counters (one device read) and the predictor's label."""
        prefetched, used = (int(v) for v in self.counts.sum(0).tolist())
        return {"prefetch": self.predictor.label, "prefetched": prefetched, "prefetch_used": used,
                "prefetch_precision": used / prefetched if prefetched else None,
                "prefetch_programs": self.grid.programs, "prefetch_tile": [self.grid.block, self.grid.warps]}
