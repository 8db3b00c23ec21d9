"""What the device cache's executor changes between decode steps, by timing them: the live
quota of its CPU share (`moe/quota_controller.py`) and, with `--moe-prefetch auto`, decode
prefetch on or off (`moe/prefetch_choice.py`). A captured step can't change either, so each
combination is a graph variant the runner captured (`graph_variants`), and the one the
choices name (`graph_variant`) is replayed: the share's ("plain" at level 0, "share"
above, None without a live quota) with "+prefetch" where prefetch runs.

Mixed into `DeviceOffloadExecutor` (`moe/device_offload.py`), whose attributes it reads:
the share, the cache, the prefetch and the statistics.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.prefetch_choice import PrefetchChooser, prefetch_variant, split_variant, with_prefetch
from edgemoe.moe.quota_controller import QuotaController
from edgemoe.moe.quota_levels import share_scale

if TYPE_CHECKING:
    from edgemoe.moe.cpu_share import CpuShare
    from edgemoe.moe.device_cache import DeviceSlotCache
    from edgemoe.moe.prefetch import DecodePrefetch
    from edgemoe.moe.stats import MoEStats

log = logging.getLogger(__name__)

PLAIN, SHARE = "plain", "share"  # graph variants with a live quota: without / with the CPU share
DEFAULT_TOP_K = 8  # the live quota's ceiling (experts a layer) when the caller doesn't say top-k


class StepVariants:
    """The live quota's level and prefetch's choice, and the graph variant they name."""

    graph_variants: tuple[str | None, ...] = (None,)
    controller: QuotaController | None = None
    prefetch_chooser: PrefetchChooser | None = None
    _share_variant: str | None = None  # PLAIN / SHARE with a live quota
    _prefetching: bool = True  # whether a step prefetches (where a prefetch is enabled and covers it)

    if TYPE_CHECKING:  # the executor's
        cpu_share: CpuShare | None
        cache: DeviceSlotCache
        prefetch: DecodePrefetch | None
        stats: MoEStats

        def _make_share(self, quota: int | None, kernel: CpuExperts | None,
                        fraction: float | None = None) -> CpuShare: ...

    @property
    def graph_variant(self) -> str | None:
        if self.prefetch_chooser is None:
            return self._share_variant
        return prefetch_variant(self._share_variant, self._prefetching)

    def use_graph_variant(self, variant: str | None) -> None:
        """Run the following forwards as `variant` (the runner sets each in turn to capture it)."""
        if variant not in self.graph_variants:
            raise ValueError(f"graph variant {variant!r}: this executor has {self.graph_variants}")
        self._share_variant, on = split_variant(variant)
        self._prefetching = on or self.prefetch_chooser is None

    def _choose_prefetch(self) -> None:
        """--moe-prefetch auto: prefetch on or off by timing decode steps, each captured."""
        self.prefetch_chooser = chooser = PrefetchChooser()
        self.graph_variants = with_prefetch(self.graph_variants)
        self._prefetching = chooser.on
        self.stats.sources.append(chooser.snapshot)

    def _make_live_share(self, label: str, kernel: CpuExperts | None, top_k: int, num_layers: int) -> None:
        """The share with a live quota and its two graph variants; offload where it can't run."""
        try:
            self.cpu_share = self._make_share(0, kernel)
        except ValueError as e:
            (log.warning if label == "hybrid" else log.info)("moe %s: no CPU share (%s): offload", label, e)
            return
        scale = share_scale()
        start = scale.hybrid_start() if label == "hybrid" else 0
        self.controller = QuotaController.live(max_level=scale.max_level(top_k), start=start, label=label, scale=scale)
        self.cpu_share.set_levels(scale, self.controller.max_level)
        self._level = -1
        self._sample: tuple[torch.Tensor, int] | None = None  # the informed start's: (misses then, decode steps since)
        self.graph_variants = (PLAIN, SHARE)
        self._apply_level(start)
        self.stats.sources.append(self.controller.snapshot)

    def _apply_level(self, level: int) -> None:
        """The share's pick at `level` (device copies, ordered before the next step's work)
        and the variant that runs it (level 0: the graphs without the share)."""
        if level != self._level:
            self.cpu_share.apply_level(level)  # type: ignore[union-attr]
            self._level = level
        self._share_variant = SHARE if level > 0 else PLAIN

    def _steer(self, now: float, decode_batch: int | None) -> None:
        """Before a step: the prefetch chooser's turn (the quota's controller sits out the
        steps it measures), then the quota's."""
        measuring = False
        if (chooser := self.prefetch_chooser) is not None:
            covered = decode_batch is not None and self.prefetch.covers(decode_batch)  # type: ignore[union-attr]
            settled = self.controller is None or self.controller.holding
            measuring = chooser.step(now, decode_batch if covered else None, may_recheck=settled)
            self._prefetching = chooser.on
        if self.controller is None:
            return
        share = self.cpu_share
        assert share is not None
        taken = decode_batch if decode_batch is not None and decode_batch <= share.rows else None
        if measuring:
            self.controller.pause()
        else:
            self.controller.step(now, taken)
        if self.controller.predicted is None:
            self._sample_start(taken is not None)
        self._apply_level(self.controller.level)
        share.expect_rings(decode_batch is None or (taken is not None and self._share_variant == SHARE))

    def _sample_start(self, decode: bool) -> None:
        """The informed start's sample (`QuotaController.inform`): the misses of consecutive
        decode steps the share takes, from a device snapshot at the first (stream-ordered,
        no read) to one read once the controller has a window and the sample as many steps.
        Any other step restarts it: a prompt chunk's misses are not a decode step's."""
        if not decode:
            self._sample = None
        elif self._sample is None:
            self._sample = (self._misses_so_far(), 0)
        else:
            base, steps = self._sample[0], self._sample[1] + 1  # the steps queued since the snapshot
            self._sample = (base, steps)
            if self.controller.windows and steps >= self.controller.window:  # type: ignore[union-attr]
                self._inform(base, steps)

    def _misses_so_far(self) -> torch.Tensor:
        """Every miss so far, the CPU's included: a device scalar (no read)."""
        return self.cache.counts[:, 1].sum() + self.cpu_share.cpu_counts.sum()  # type: ignore[union-attr]

    def _inform(self, base: torch.Tensor, steps: int) -> None:
        """The controller's informed start from the sample: m (misses a layer a decode step),
        a copy's seconds (the share's device rate: the expert's bytes at `DEVICE_GBPS`; no
        measured link rate here, since replayed steps time no copies) and a CPU expert's at
        one token (the share's fit of its calls so far: fixed + one pair)."""
        share = self.cpu_share
        assert share is not None and self.controller is not None
        misses = int((self._misses_so_far() - base).item())  # NOTE: the one device read: waits for the queued steps
        share.refit_rates()
        fixed, per_pair, device = share.rate_ns[:3]
        self._sample = None
        self.controller.inform(misses / (steps * self.cache.counts.shape[0]), device * 1e-9, (fixed + per_pair) * 1e-9)
