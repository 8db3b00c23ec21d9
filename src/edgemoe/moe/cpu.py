"""CPU and hybrid executors: slot-cache hits on the device, misses (some or all)
computed by host threads straight from the expert store.

- cpu: every miss runs on the CPU; the misses are then admitted into the slot cache
  (copied after the CPU work, off the critical path), so hot experts migrate to the
  device and later hit.
- hybrid: a fixed fraction of the misses (`--moe-hybrid-fraction`, those with the
  fewest tokens, where the CPU is least behind) runs on the CPU; the rest is copied
  in and runs on the device, overlapped with the CPU work when a GPU is present.

The CPU's pairs are written into the same contribution cells as the device's (a mask
of the routing), so the sum over k is the same fixed-order sum.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from edgemoe.kernels.moe_experts import Activation, expert_mlp, moe_combine
from edgemoe.moe.offload import OffloadExecutor
from edgemoe.moe.stats import Stopwatch
from edgemoe.moe.store import ExpertStore
from edgemoe.quant import dequantise_expert


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
        max_tokens: int = 256,
    ) -> None:
        super().__init__(store, device, act, num_layers, num_slots, policy, max_tokens)
        if not 0.0 <= cpu_fraction <= 1.0:
            raise ValueError(f"moe_hybrid_fraction must be in [0, 1] (got {cpu_fraction})")
        self.store, self.cpu_fraction, self.admit = store, cpu_fraction, admit_cpu_misses
        # One worker: torch's intra-op threads parallelise each expert already.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgemoe-cpu-experts") if device.type == "cuda" else None

    def forward(self, layer, x, topk_ids, topk_weights, residual=None):  # type: ignore[override]
        self.stats.count_tokens(layer, x.shape[0])
        cells = self.workspace.cells(topk_ids)
        self.readback.start(topk_ids, x)
        self.compute_hits(layer, x, topk_ids, topk_weights, cells)
        ids, x_host = self.readback.wait()
        routed = np.unique(ids).tolist()
        residency = self.cache.partition(layer, routed)
        cpu_experts = self._cpu_share(residency.misses, ids)
        on_cpu = set(cpu_experts)
        job = self._start_cpu(layer, cpu_experts, x_host, ids, topk_weights)
        self.run_misses(layer, [e for e in routed if e not in on_cpu], x, topk_ids, topk_weights, cells)
        if cpu_experts:
            self._write_cpu_cells(job, cells)
            self.stats.cpu_experts[layer] += len(cpu_experts)
            self.stats.misses[layer] += len(cpu_experts)
            if self.admit:
                self._admit(layer, cpu_experts[: self.cache.num_slots])
        return moe_combine(cells, x.dtype, residual)

    def _cpu_share(self, misses: tuple[int, ...], ids: np.ndarray) -> list[int]:
        n = math.ceil(self.cpu_fraction * len(misses) - 1e-9)
        if n == 0:
            return []
        counts = np.bincount(ids.ravel(), minlength=self.num_experts)
        return sorted(sorted(misses, key=lambda e: (int(counts[e]), e))[:n])

    def _start_cpu(self, layer, experts, x, ids, topk_weights):  # noqa: ANN001, ANN202
        if not experts:
            return None
        # The weights are tiny: one copy here, after the routing is known anyway.
        args = (layer, experts, x, ids, topk_weights.cpu())
        return self._pool.submit(self._cpu_compute, *args) if self._pool else self._cpu_compute(*args)

    def _cpu_compute(self, layer, experts, x, ids, weights) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        """(flat pair indices [n], their cells [n, H]) for the CPU experts' pairs; each
        expert's tokens in (t, k) order, as the device kernel batches them."""
        K = ids.shape[1]
        pair_parts, value_parts = [], []
        with Stopwatch() as w:
            for e in experts:
                t, k = np.nonzero(ids == e)
                t_idx, k_idx = torch.from_numpy(t), torch.from_numpy(k)
                y = expert_mlp(x[t_idx], *self._weights(layer, e, x.dtype), self.act)
                value_parts.append(y.float() * weights[t_idx, k_idx, None].float())
                pair_parts.append(t_idx * K + k_idx)
        self.stats.cpu_s += w.seconds
        self.profiler.add_host_time("moe/cpu", w.seconds)
        return torch.cat(pair_parts), torch.cat(value_parts)

    def _weights(self, layer: int, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up, down) of one expert to compute with: as stored, or dequantised to fp32
        (the reference; the quantised C kernels replace it, kernels/cpu_experts.py)."""
        fmt = self.store.format
        if not fmt.quantised:
            return self.store.expert(layer, e)
        hidden, inter = self.store.down_shape
        gate_up, down = dequantise_expert(fmt, self.store.expert_parts(layer, e), hidden, inter)
        return gate_up.to(dtype), down.to(dtype)

    def _write_cpu_cells(self, job, cells: torch.Tensor) -> None:  # noqa: ANN001
        pairs, values = job.result() if isinstance(job, Future) else job
        flat = cells.view(-1, cells.shape[-1])
        flat[pairs.to(cells.device)] = values.to(cells.device, non_blocking=True)

    def _admit(self, layer: int, experts: list[int]) -> None:
        """Copy CPU-computed misses into slots for next time (no compute)."""
        with self.cache.layer_waves(layer, experts) as waves:
            for wave in waves:
                self.slots.load(layer, wave)
        self.mirror_map()

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True)
        super().close()
