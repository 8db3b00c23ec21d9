"""CPU and hybrid executors: slot-cache hits on the device, misses (some or all)
computed by host threads straight from the expert store.

- cpu: every miss runs on the CPU; the misses are then admitted into the slot cache
  (copied after the CPU work, off the critical path), so hot experts migrate to the
  device and later hit.
- hybrid: a fixed fraction of the misses (`--moe-hybrid-fraction`, those with the
  fewest tokens, where the CPU is least behind) runs on the CPU; the rest is copied
  in and runs on the device, overlapped with the CPU work when a GPU is present.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from edgemoe.kernels.moe_experts import Activation, moe_combine, moe_experts_partial
from edgemoe.moe.executor import new_contrib, routed_experts
from edgemoe.moe.offload import OffloadExecutor
from edgemoe.moe.stats import Stopwatch
from edgemoe.moe.store import ExpertStore


class SplitExecutor(OffloadExecutor):
    """Offload with a share of the misses computed on the host CPU."""

    def __init__(
        self,
        store: ExpertStore,
        device: torch.device,
        act: Activation,
        num_layers: int,
        num_slots: int,
        cpu_fraction: float,
        admit_cpu_misses: bool,
        policy: str = "lru",
    ) -> None:
        super().__init__(store, device, act, num_layers, num_slots, policy)
        if not 0.0 <= cpu_fraction <= 1.0:
            raise ValueError(f"moe_hybrid_fraction must be in [0, 1] (got {cpu_fraction})")
        self.store, self.cpu_fraction, self.admit = store, cpu_fraction, admit_cpu_misses
        # One worker: torch's intra-op threads parallelise each expert already.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgemoe-cpu-experts") if device.type == "cuda" else None

    def forward(self, layer, x, topk_ids, topk_weights):  # type: ignore[override]
        self.stats.count_tokens(layer, x.shape[0])
        experts = routed_experts(topk_ids)
        residency = self.cache.partition(layer, experts)
        cpu_experts = self._cpu_share(residency.misses, topk_ids)
        on_cpu = set(cpu_experts)
        device_experts = [e for e in experts if e not in on_cpu]
        contrib = new_contrib(topk_ids, x)
        cpu_job = self._start_cpu(layer, cpu_experts, x, topk_ids, topk_weights)
        self.run_waves(layer, device_experts, x, topk_ids, topk_weights, contrib)
        if cpu_experts:
            # NOTE: cells of CPU experts are still 0 on the device: adding is exact.
            contrib += (cpu_job.result() if isinstance(cpu_job, Future) else cpu_job).to(contrib.device)
            self.stats.cpu_experts[layer] += len(cpu_experts)
            self.stats.misses[layer] += len(cpu_experts)
            if self.admit:
                self._admit(layer, cpu_experts[: self.cache.num_slots])
        return moe_combine(contrib, x.dtype)

    def _cpu_share(self, misses: tuple[int, ...], topk_ids: torch.Tensor) -> list[int]:
        n = math.ceil(self.cpu_fraction * len(misses) - 1e-9)
        if n == 0:
            return []
        counts = torch.bincount(topk_ids.flatten().cpu(), minlength=max(misses) + 1)
        return sorted(sorted(misses, key=lambda e: (int(counts[e]), e))[:n])

    def _start_cpu(self, layer, experts, x, topk_ids, topk_weights):  # noqa: ANN001, ANN202
        if not experts:
            return None
        args = (layer, experts, x.cpu(), topk_ids.cpu(), topk_weights.cpu())
        return self._pool.submit(self._cpu_compute, *args) if self._pool else self._cpu_compute(*args)

    def _cpu_compute(self, layer, experts, x, topk_ids, topk_weights) -> torch.Tensor:  # noqa: ANN001
        contrib = new_contrib(topk_ids, x)
        with Stopwatch() as w:
            for e in experts:
                gate_up, down = self.store.expert(layer, e)
                moe_experts_partial(x, topk_ids, topk_weights, [e], [0], gate_up[None], down[None], self.act, contrib)
        self.stats.cpu_s += w.seconds
        return contrib

    def _admit(self, layer: int, experts: list[int]) -> None:
        """Copy CPU-computed misses into slots for next time (no compute)."""
        with self.cache.layer_waves(layer, experts) as waves:
            for wave in waves:
                self.slots.load(layer, wave)

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True)
        super().close()
