"""Offload with the expert cache on the device (`--expert-cache device`).

Per MoE layer, everything is device work issued without waiting: the device slot cache
(`moe/device_cache.py`) plans the layer's waves from its routing (slot ids, a fixed-size
miss list, the map/owner/recency updates), a mover (`moe/movers.py`) fills the missed
slots from the host store, and the slot-addressed MoE computes the wave. With the
gather mover no step of it reads the device back, so a decode step is captured whole in
a CUDA graph (`graph_safe`); the copy-engine mover reads each wave's miss list (the hit
pass runs meanwhile) and runs eagerly.

With a CPU share (`--moe-backend hybrid` or `auto`), the coldest misses of each layer run
on the CPU inside the same step (`moe/cpu_share.py`: the C kernel on a thread the device
rings, no host read), and the cache plans the routing without them. Their number a layer is
fixed (`--cpu-experts-per-layer`, and/or `--moe-hybrid-fraction`'s share of the layer's
misses) or live: chosen between steps by timing decode steps (`moe/quota_controller.py`).

Prompt chunks of ≥ 1,024 tokens stream every layer's experts through slots the cache lends
(`moe/prefill_stream.py`) instead of planning; decode steps may prefetch the next layer's
predicted experts on a side stream (`moe/prefetch.py`, `--moe-prefetch on`, or `auto`: on or off
by timing decode steps, `moe/step_variants.py`).

Same outputs as `OffloadExecutor` (moe/offload.py): the same decisions as its
`SlotCache` with the same policy ("lru" or "lru-plain"), and every wave a mask over one
routing written into per-pair cells, so results are bitwise the resident ones on one device. Hits, misses and bytes
are counted on the device and read only when the statistics are asked for
(`MoEStats.drains`).
"""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import torch

from edgemoe.kernels.cell_sources import CellSources
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.kernels.moe_experts import Activation
from edgemoe.kernels.moe_quant import moe_slots_parts
from edgemoe.kernels.share_state import DECODE
from edgemoe.moe.cpu_share import CpuShare
from edgemoe.moe.device_cache import DeviceSlotCache, WavePlan
from edgemoe.moe.device_counts import DeviceCounts
from edgemoe.moe.executor import CellsExecutor, CellWorkspace
from edgemoe.moe.movers import CopierMover, make_mover
from edgemoe.moe.offload import SlotBanks
from edgemoe.moe.predictors import Predictor, RouterScores
from edgemoe.moe.prefetch import DecodePrefetch
from edgemoe.moe.prefill_stream import PrefillStream, stream_min_tokens
from edgemoe.moe.side_copies import EngineCopies, engine_copies
from edgemoe.moe.quota_levels import FRACTION
from edgemoe.moe.slot_lending import make_lending
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.step_variants import DEFAULT_TOP_K, PLAIN, StepVariants
from edgemoe.moe.store import ExpertStore


log = logging.getLogger(__name__)


def _masked(ids: torch.Tensor, dead: torch.Tensor | None) -> torch.Tensor:
    """The routing with the padding rows' ids -1."""
    return ids if dead is None else ids.masked_fill(dead[:, None], -1)


class DeviceOffloadExecutor(StepVariants, CellsExecutor):
    """The slot cache's state lives on the device (`cache`); `mover`: "gather" | "copy";
    `policy`: "lru" (scan-resistant) | "lru-plain".

    Padding rows (decode batches padded to a captured size) route nothing: the runner
    names the live rows with `set_live_rows` inside the step it may capture (the
    `num_padding` argument is a Python int, frozen when a graph is captured); direct
    callers pass `num_padding`. Padding rows' outputs are zeros.

    `cpu_experts_per_layer`: the CPU's quota of each layer's misses (None: no fixed share;
    `cpu_share.quota` may be rewritten between steps), run by `cpu_kernel` (default: the
    C kernel on every physical core but the one driving the GPU); `prompt_cpu`: the share's
    prompt rule for chunks of up to `max_tokens` (`moe/cpu_share.py`; None: on where the share
    runs, True: also a warning where it can't). `live_quota` ("hybrid"
    | "auto", without a fixed quota): the quota is chosen by timing decode steps
    (`moe/quota_controller.py`, levels up to `top_k` experts a layer; hybrid starts at one
    expert a layer, auto at none); at level 0 the runner replays graphs captured without
    the share (`graph_variants`), so auto costs nothing where the CPU doesn't help. Where
    the share can't run (no C kernel, a format it doesn't read) live_quota falls back to
    offload, said in the log for hybrid. `stream_tokens`: prompt chunks of this many
    tokens or more stream every layer's experts through lent slots (`moe/prefill_stream.py`;
    default `EDGEMOE_PREFILL_STREAM_TOKENS` or 1,024; 0: never). `lend_slots` (the memory
    plan's): the last slots' memory is lent to those chunks' activations
    (`moe/slot_lending.py`), and `planned_tokens`, the largest step that doesn't borrow,
    sizes the persistent cell buffer (longer chunks get theirs from the loan)."""

    def __init__(
        self,
        store: ExpertStore,
        device: torch.device,
        act: Activation,
        num_layers: int,
        num_slots: int,
        mover: str = "gather",
        max_tokens: int = 256,
        cpu_experts_per_layer: int | None = None,
        cpu_kernel: CpuExperts | None = None,
        cpu_fraction: float | None = None,
        policy: str = "lru",
        live_quota: str | None = None,
        top_k: int | None = None,
        prompt_cpu: bool | None = False,
        stream_tokens: int | None = None,
        lend_slots: int = 0,
        planned_tokens: int | None = None,
    ) -> None:
        self.act, self.device, self.num_experts, self.store = act, device, store.num_experts, store
        # The share's prompt rule covers every chunk (None: on where the share runs, said nowhere else).
        self._prompt_rows = max_tokens if prompt_cpu is not False else 0
        self.stats = MoEStats(num_layers, first_layer=store.layers[0])
        self.cache = DeviceSlotCache(num_slots, num_layers, store.num_experts, device, policy=policy)
        self.slots = SlotBanks(store, num_slots, device, self.stats, lend_slots)
        self.mover = make_mover(mover, store, self.slots)
        self.graph_safe = self.mover.graph_safe
        self.quiet_eager = isinstance(self.mover, CopierMover)  # MoEExecutor's note
        if isinstance(self.mover, CopierMover):  # its thread's counts; a failed copy counts in copier_errors
            self.stats.sources.append(lambda: {f"copier_{k}": v for k, v in self.mover.bell.stats().items()})
        min_tokens = stream_min_tokens() if stream_tokens is None else stream_tokens
        self.lending = make_lending(self.cache, self.slots, lend_slots, min_tokens, self.num_experts,
                                    lambda: self.workspace.drop_loaned())
        below = self.lending.first if self.lending is not None else num_slots
        self.streaming = PrefillStream(self.cache, self.slots, store, min_tokens, below)
        self.stats.sources.append(lambda: {"streamed_chunks": self.streaming.chunks,
                                           "slot_loans": self.lending.loans if self.lending else 0})
        self.routers: dict[int, RouterScores] = {}  # the decode prefetch's predictor reads them
        self.prefetch: DecodePrefetch | None = None
        loaned = self.lending is not None and planned_tokens is not None
        self.workspace = CellWorkspace(planned_tokens if loaned else max_tokens, store.down_shape[0], device,  # type: ignore[arg-type]
                                       loaned=loaned)
        self.expert_nbytes = store.expert_nbytes
        self.num_decode, self._bias = 0, {}  # the layer being computed's, and its expert biases' `bias_args`
        self._dead: torch.Tensor | None = None  # the step's padding rows: ~live, once a step, not a layer
        self._sources: CellSources | None = None  # the last layer's cells left to the combine
        self.stats.info.update(expert_cache="device", expert_mover=self.mover.name, expert_policy=policy)
        self.stats.drains.append(DeviceCounts(self.cache, store.expert_nbytes, lambda: self.cpu_share))
        self._own_kernel: CpuExperts | None = None  # the share's kernel when made here (`cpu_kernel` None)
        fixed = cpu_experts_per_layer is not None or cpu_fraction is not None
        self.cpu_share = self._make_share(cpu_experts_per_layer, cpu_kernel, cpu_fraction) if fixed else None
        if live_quota is not None and not fixed:
            self._make_live_share(live_quota, cpu_kernel, top_k or DEFAULT_TOP_K, num_layers)
        if prompt_cpu and self.cpu_share is None:
            log.warning("--prompt-cpu: no CPU share here (offload, or the share can't run): prompt chunks copy "
                        "their misses")

    def register_router(self, layer: int, router: torch.Tensor, bias=None, sigmoid: bool = False,  # noqa: ANN001
                        softmax: bool = False) -> None:
        self.routers[layer] = RouterScores(router, bias, sigmoid, softmax)

    def enable_prefetch(self, predictor: Predictor, top_k: int, auto: bool = False) -> None:
        """Decode prefetch (`moe/prefetch.py`) with `predictor`, `top_k` experts a token;
        `auto`: on or off by timing decode steps (`moe/prefetch_choice.py`)."""
        if not self.mover.graph_safe:
            raise ValueError("moe_prefetch (--moe-prefetch on) copies beside the chain: the gather, or the copy "
                             "engine through the copier (a GPU, a C compiler), from a page-locked store (this run "
                             "moves after a host read)")
        self.prefetch = DecodePrefetch(self.cache, self.mover, list(self.store.layers), predictor, top_k,
                                       engine=lambda buffers: engine_copies(self.mover, self.store, self.slots,
                                                                            buffers))
        self.stats.sources.append(self.prefetch.snapshot)
        if auto:
            self._choose_prefetch()
        self.quiet_eager = self.quiet_eager or isinstance(self.prefetch.copies, EngineCopies)  # a copier of its own

    def _make_share(self, quota: int | None, kernel: CpuExperts | None, fraction: float | None = None) -> CpuShare:
        """The share at a fixed `quota` a layer (None: no cap) and `fraction` of each layer's
        misses (None: all of them, the quota alone)."""
        from edgemoe.moe.cpu import cpu_threads

        if kernel is None:  # ours: closed with the executor (its pool's pinned cores back for the next engine)
            kernel = self._own_kernel = CpuExperts(threads=cpu_threads(self.device))
        cap = self.num_experts if quota is None else quota
        share = CpuShare(self.store, kernel, self.cache.num_layers, cap, self.device, prompt_rows=self._prompt_rows,
                         act=self.act, biases=self.host_biases)
        self.stats.info.update(cpu_kernel=kernel.name, cpu_threads=kernel.threads, cpu_experts_per_layer=quota,
                               prompt_cpu=bool(share.prompt_rows))
        if fraction is not None:  # a fixed share of each layer's misses (the cache replay's unit too, when uncapped)
            self.stats.info.update(cpu_fraction_of_misses=share.set_fraction(fraction),
                                   **({"cpu_quota_unit": FRACTION.unit} if quota is None else {}))
        self.stats.sources.append(lambda: {"cpu_ns_per_expert": share.rate_ns[0], "cpu_ns_per_pair": share.rate_ns[1],
                                           "cpu_pinned_workers": len(kernel.pinned),
                                           "cpu_prior_times_ns": share.prior_times_ns, "cpu_pool": kernel.pool_stats()})
        return share

    def before_step(self, now: float, decode_batch: int | None, prompt_rows: int = 0) -> None:
        if self.lending is not None:
            self.lending.before_step(prompt_rows)
        share = self.cpu_share
        if share is not None and share.prompt_rows and decode_batch is None:
            share.refit_rates()  # a prompt chunk comes: its rule balances by the CPU's latest rates
        self._steer(now, decode_batch)  # the live quota's level, prefetch on or off (`moe/step_variants.py`)

    def _share_rule(self, x: torch.Tensor) -> tuple[CpuShare | None, int]:
        """The share and its pick for this step, or (None, 0): a decode step of a live quota
        at level 0 (its variant runs without the share), or a step the share doesn't take."""
        share = self.cpu_share
        rule = share.rule_for(x) if share is not None else None
        if rule is None or (rule == DECODE and self._share_variant == PLAIN):
            return None, 0
        return share, rule

    def set_live_rows(self, live: torch.Tensor | None) -> None:
        self._dead = None if live is None else ~live

    def _cells(self, layer, x, topk_ids, topk_weights, num_decode, num_padding) -> torch.Tensor:  # noqa: ANN001
        """The layer's contribution cells [T, K, H]: every live pair computed, padding rows zeros."""
        self.stats.count_tokens(layer, x.shape[0] - num_padding)
        self.num_decode, self._bias = num_decode, self.bias_args(layer, topk_ids)
        dead = self._dead_rows(topk_ids, num_padding)
        cells = self.workspace.cells(topk_ids)
        # The live view's marks cost a few ops per wave: only while watched (when a graph is captured).
        self.cache.mark_events = self.stats.activity is not None
        prefetch = self.prefetch if self.prefetch is not None and self._prefetching and self.prefetch.covers(x.shape[0]) \
            else None
        if self.prefetch is not None and prefetch is None:
            self.prefetch.join_all()  # a step that doesn't prefetch plans with nothing in flight
        cpu: CellSources | None = None
        if self.streaming.covers(layer, x.shape[0] - num_decode - num_padding):  # a long chunk: no plan, no share
            if self.lending is not None and not self.lending.lent:  # a caller that skipped before_step
                self.lending.lend()
            self._compute(x, self.streaming.slot_ids(layer, _masked(topk_ids, dead)), topk_weights, cells)
            self.streaming.computed(layer)
        else:
            cpu = self._planned(layer, x, topk_ids, dead, topk_weights, cells, prefetch)
        # Unwritten padding cells and the CPU's in its mailbox: the combine reads 0 / the mailbox (no launch of its own).
        self._sources = (cpu or CellSources())._replace(dead=dead) if dead is not None or cpu is not None else None
        return cells

    def _take_sources(self) -> CellSources | None:
        sources, self._sources = self._sources, None
        return sources

    def _planned(self, layer: int, x, ids, dead, topk_weights, cells,  # noqa: ANN001
                 prefetch: DecodePrefetch | None) -> CellSources | None:
        """The cache plans the layer's waves of `ids` without the `dead` rows' ([T] bool or
        None); the CPU share (if any) takes its pairs first; `prefetch`: the decode prefetch
        when this step prefetches. Returns where the CPU's cells lie (None: no share ran)."""
        share, rule = self._share_rule(x)
        planned_dead = None  # the dead rows the plan drops itself
        if share is not None and prefetch is None:  # the share drops the dead rows' pairs in its own launch
            ids = share.begin(layer, x, ids, topk_weights, self.cache.slot_map[layer], rule, dead)
        elif share is None and prefetch is None:  # the plan does (no masking launch on the chain)
            planned_dead = dead
        else:
            routed = ids = _masked(ids, dead)  # the prefetch counts its hits against the whole routing
            if share is not None:  # the CPU's pairs start now; the device plans and runs the rest
                ids = share.begin(layer, x, ids, topk_weights, self.cache.slot_map[layer], rule,
                                  prefetched=prefetch.loaded(layer))
        pins, num_pinned = (None, 0) if prefetch is None else prefetch.pins(layer, x.shape[0])
        for plan in self.cache.layer_waves(layer, ids, pins, num_pinned, planned_dead):  # one wave when it prefetches
            after_move = None if prefetch is None else partial(prefetch.after_move, layer, x, routed, plan.slot_ids,
                                                               share)
            self._run_wave(layer, x, ids, plan, topk_weights, cells, after_move)
        return None if share is None else share.join(layer)

    def _dead_rows(self, topk_ids: torch.Tensor, num_padding: int) -> torch.Tensor | None:
        """The padding rows [T] bool (the runner's live rows, else the last `num_padding`), or None."""
        T = topk_ids.shape[0]
        if self._dead is not None and self._dead.shape[0] == T:
            return self._dead
        if num_padding:
            return torch.arange(T, device=topk_ids.device) >= T - num_padding
        return None

    def _run_wave(self, layer: int, x, ids, plan: WavePlan, topk_weights, cells, after_move=None) -> None:  # noqa: ANN001
        if self.mover.two_pass:  # the hits compute while the miss list travels to the host
            self.mover.begin(plan.misses)
            hit_pairs = plan.hit_pairs(ids)
            self._compute(x, plan.slot_ids.masked_fill(~hit_pairs, -1), topk_weights, cells)
            with self.profiler.region("moe/copy"):
                self.mover.move(layer, plan.misses)
            self._compute(x, plan.slot_ids.masked_fill(hit_pairs, -1), topk_weights, cells)
            return
        self._timed_move(layer, plan.misses)
        if after_move is not None:
            after_move()
        self._compute(x, plan.slot_ids, topk_weights, cells)

    def _timed_move(self, layer: int, misses: torch.Tensor) -> None:
        """The gather, timed with CUDA events when eager (a graph replays it untimed)."""
        timed = self.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()
        start = torch.cuda.Event(enable_timing=True) if timed else None
        if start is not None:
            start.record()
        self.mover.move(layer, misses)
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.stats.add_copy_interval(start, end)

    def _compute(self, x, slot_ids, topk_weights, cells) -> None:  # noqa: ANN001
        s = self.slots
        moe_slots_parts(x, slot_ids, topk_weights, s.parts, s.format, self.act, cells, self.num_decode, **self._bias)

    def resident_mask(self) -> np.ndarray:
        return self.cache.slot_map.cpu().numpy() >= 0

    def recover(self) -> None:
        # Copies that never landed would leave slots mapped to stale weights: drop them all.
        self.streaming.reset()
        if self.prefetch is not None:
            self.prefetch.reset()
        if self.lending is not None and self.lending.lent:  # the next step may plan into the tail
            self.lending.take_back()
        self.cache.clear()

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        if self.cpu_share is not None:
            self.cpu_share.close()
        if self._own_kernel is not None:
            self._own_kernel.close()
        self.mover.close()
        del self.slots, self.mover
