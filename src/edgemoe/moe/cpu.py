"""CPU and hybrid executors: slot-cache hits on the device, misses (some or all)
computed by host threads straight from the expert store.

- cpu: every miss runs on the CPU; the misses are then admitted into the slot cache
  (copied after the CPU work, off the critical path), so hot experts migrate to the
  device and later hit.
- hybrid: the live controller (`moe/controller.py`) splits each layer's misses so that
  the CPU's share (those with the fewest tokens, where the CPU is least behind) and the
  copies of the rest finish together, from start-up rates (`moe/rate_probe.py`)
  corrected by every layer's timings; `--moe-hybrid-fraction F` fixes the share instead.
- auto: the same controller also decides whether the CPU is worth using at all
  (offload: no activations read back, nothing on the CPU; or hybrid), logging why.

The CPU's pairs are written into the same contribution cells as the device's (a mask
of the routing), so the sum over k is the same fixed-order sum. SiLU experts in bf16
run the C kernel (`kernels/cpu_experts.py`, its own thread pool, held by the executor);
other dtypes run torch exactly as the device's reference kernel does, so fp32 CPU
splits stay bitwise equal to resident.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from edgemoe.env_switch import env_whole
from edgemoe.kernels import cpu_isa
from edgemoe.kernels.cpu_experts import moe_expert_cells_cpu
from edgemoe.kernels.cpu_experts_quant import moe_expert_cells_q_cpu, native_weights
from edgemoe.kernels.cpu_kernel import CpuExperts, kernel_glu
from edgemoe.kernels.moe_experts import Activation, expert_mlp, moe_combine
from edgemoe.moe.activity import CPU
from edgemoe.moe.controller import SplitController
from edgemoe.moe.offload import OffloadExecutor, pad_rows, real_rows
from edgemoe.moe.rate_probe import probe_rates
from edgemoe.moe.store import ExpertStore
from edgemoe.moe.timing import DeviceTimer
from edgemoe.quant import Parts

log = logging.getLogger(__name__)

CpuResult = tuple[torch.Tensor, torch.Tensor, float]  # (cell indices [n], values [n, H], finished at)


class SplitExecutor(OffloadExecutor):
    """Offload with a share of the misses computed on the host CPU: a fixed fraction
    (`cpu_fraction`), or, when it is None, what the controller decides (`mode`: hybrid |
    auto; `top_k` sizes auto's start-up decision)."""

    def __init__(
        self,
        store: ExpertStore,
        device: torch.device,
        act: Activation,
        num_layers: int,
        num_slots: int,
        cpu_fraction: float | None,
        admit_cpu_misses: bool,
        policy: str = "lru",
        max_tokens: int = 256,
        mode: str = "hybrid",
        top_k: int | None = None,
    ) -> None:
        super().__init__(store, device, act, num_layers, num_slots, policy, max_tokens)
        if cpu_fraction is not None and not 0.0 <= cpu_fraction <= 1.0:
            raise ValueError(f"moe_hybrid_fraction must be in [0, 1] (got {cpu_fraction})")
        self.store, self.cpu_fraction, self.admit = store, cpu_fraction, admit_cpu_misses
        # One worker drives the CPU experts (the C kernel's pool or torch's intra-op
        # threads parallelise each call) while the forward thread drives the device.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgemoe-cpu-experts") if device.type == "cuda" else None
        self.kernel = cpu_kernel_for(store, act, device)
        self.qkernel = quant_cpu_kernel_for(store, act, device)  # int8 / fp8 / int4 experts in the C kernel
        native = self.kernel or self.qkernel
        self.stats.info.update(cpu_kernel=native.name if native else "torch",
                               cpu_threads=native.threads if native else torch.get_num_threads())
        if native is not None:  # its pool pins at its first call (kernels/cpu_pinning.py)
            self.stats.sources.append(lambda: {"cpu_pinned_workers": len(native.pinned)})
        self.controller = None if cpu_fraction is not None else self._make_controller(mode, top_k)
        self._timer = DeviceTimer(device)
        self._turn = 0  # rotates ties among equally loaded misses (no expert always on the CPU)

    def _make_controller(self, mode: str, top_k: int | None) -> SplitController:
        rates = probe_rates(self.store, self.slots.gate_up, self.slots.down, self._cpu_cells)
        ctl = SplitController(rates, mode, window=2 * len(self.store.layers))
        log.info("moe %s: start-up rates %s", mode, rates.describe(self.store.expert_nbytes))
        resident = self.cache.num_slots / (len(self.store.layers) * self.num_experts)
        ctl.decide_initial(max(1, round((top_k or 8) * (1 - min(resident, 1.0)))), self.store.expert_nbytes)
        self.stats.sources.append(ctl.snapshot)
        return ctl

    def forward(self, layer, x, topk_ids, topk_weights, residual=None, num_decode=0, num_padding=0):  # type: ignore[override]
        x, topk_ids, topk_weights, residual = real_rows(x, topk_ids, topk_weights, residual, num_padding)
        self.stats.count_tokens(layer, x.shape[0])
        self.num_decode, self._bias = num_decode, self.bias_args(layer, topk_ids)
        cells = self.workspace.cells(topk_ids)
        ctl = self.controller
        self.readback.start(topk_ids, x if ctl is None or ctl.wants_cpu() else None)
        self._timer.start()
        self.compute_hits(layer, x, topk_ids, topk_weights, cells)
        ids, x_host = self.readback.wait()
        routed = np.unique(ids).tolist()
        misses = self.cache.partition(layer, routed).misses
        counts = np.bincount(ids.ravel(), minlength=self.num_experts)
        cpu_experts, admit = self._share(misses, counts, x_host is not None)
        on_cpu = set(cpu_experts)
        job = self._start_cpu(layer, cpu_experts, x_host, ids, topk_weights)
        self.run_misses(layer, [e for e in routed if e not in on_cpu], x, topk_ids, topk_weights, cells)
        if admit:  # the device side has slack while the CPU works: fill slots meanwhile
            self._admit(layer, admit)
        if ctl is not None:
            ctl.observe_device(len(misses) - len(cpu_experts) + len(admit), self._timer.stop())
        if cpu_experts:
            seconds = self._write_cpu_cells(job, cells)
            if ctl is not None:
                ctl.observe_cpu(len(cpu_experts), int(counts[cpu_experts].sum()), seconds)
            self.stats.cpu_experts[layer] += len(cpu_experts)
            self.stats.misses[layer] += len(cpu_experts)
            if self.stats.activity is not None:  # someone watches the live view
                self.stats.activity.mark(layer, cpu_experts, CPU)
            if self.admit:
                self._admit(layer, cpu_experts[: self.cache.num_slots])
        return pad_rows(moe_combine(cells, x.dtype, residual), num_padding)

    def _share(self, misses: tuple[int, ...], counts: np.ndarray, have_x: bool) -> tuple[list[int], list[int]]:
        """(misses for the CPU, those of them to admit into slots meanwhile)."""
        if self.controller is None:
            return self._cpu_share(misses, counts), []
        if misses:
            self._turn += 1
            r = self._turn % len(misses)
            misses = misses[r:] + misses[:r]
        split = self.controller.split([int(counts[e]) for e in misses], have_x)
        cpu = [misses[i] for i in split.order[: split.cpu]]
        return cpu, cpu[len(cpu) - split.admit :] if split.admit else []

    def _cpu_share(self, misses: tuple[int, ...], counts: np.ndarray) -> list[int]:
        assert self.cpu_fraction is not None
        n = math.ceil(self.cpu_fraction * len(misses) - 1e-9)
        if n == 0:
            return []
        return sorted(sorted(misses, key=lambda e: (int(counts[e]), e))[:n])

    def _start_cpu(self, layer, experts, x, ids, topk_weights) -> Future | CpuResult | None:  # noqa: ANN001
        if not experts:
            return None
        # The weights are tiny: one copy here, after the routing is known anyway.
        args = (layer, experts, x, ids, topk_weights.cpu(), time.perf_counter())
        return self._pool.submit(self._cpu_compute, *args) if self._pool else self._cpu_compute(*args)

    def _cpu_compute(self, layer, experts, x, ids, weights, submitted: float) -> CpuResult:  # noqa: ANN001
        """The CPU experts' cells, and the wall-clock time since submission (the hand-off included)."""
        pairs, values = self._cpu_cells(layer, experts, x, ids, weights)
        seconds = time.perf_counter() - submitted
        self.stats.cpu_s += seconds
        self.profiler.add_host_time("moe/cpu", seconds)
        return pairs, values, seconds

    def _cpu_cells(self, layer, experts, x, ids, weights) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        """(flat pair indices [n], their cells [n, H]) for the CPU experts' pairs."""
        if self.store.format.quantised:
            parts: list[Parts] = [self.store.expert_parts(layer, e) for e in experts]
            # NOTE: fp32 activations take the reference (bitwise the device's on the CPU), as bf16 stores do.
            kernel = self.qkernel if x.dtype == torch.bfloat16 else None
            return moe_expert_cells_q_cpu(x, torch.from_numpy(ids), weights, experts, parts, self.store.format, kernel,
                                          self.act, self.host_bias(layer))
        if self.kernel is not None:
            pairs = [self.store.expert(layer, e) for e in experts]
            return moe_expert_cells_cpu(x, torch.from_numpy(ids), weights, experts, pairs, self.kernel, self.act,
                                        self.host_bias(layer))
        return self._cpu_cells_torch(layer, experts, x, ids, weights)

    def _cpu_cells_torch(self, layer, experts, x, ids, weights) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        """The torch path: each expert's tokens in (t, k) order, as the device's
        reference kernel batches them, so the cells are bitwise the device's on the CPU."""
        K, bias = ids.shape[1], self.host_bias(layer)
        pair_parts, value_parts = [], []
        for e in experts:
            t, k = np.nonzero(ids == e)
            t_idx, k_idx = torch.from_numpy(t), torch.from_numpy(k)
            gate_up, down = self.store.expert(layer, e)
            y = expert_mlp(x[t_idx], gate_up, down, self.act, None if bias is None else bias.of(e))
            value_parts.append(y.float() * weights[t_idx, k_idx, None].float())
            pair_parts.append(t_idx * K + k_idx)
        return torch.cat(pair_parts), torch.cat(value_parts)

    def _write_cpu_cells(self, job: Future | CpuResult, cells: torch.Tensor) -> float:
        """Scatter the CPU's cells into the device's; returns the CPU job's seconds."""
        pairs, values, seconds = job.result() if isinstance(job, Future) else job
        flat = cells.view(-1, cells.shape[-1])
        flat[pairs.to(cells.device)] = values.to(cells.device, non_blocking=True)
        return seconds

    def _admit(self, layer: int, experts: list[int]) -> None:
        """Copy CPU-computed misses into slots for next time (no compute)."""
        with self.cache.layer_waves(layer, experts) as waves:
            for wave in waves:
                self.slots.load(layer, wave)
        self.mirror_map()

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True)
        for kernel in (self.kernel, self.qkernel):
            if kernel is not None:
                kernel.close()
        super().close()


def cpu_threads(device: torch.device) -> int:
    """Threads for the CPU experts: every physical core, less one for the thread that
    drives the GPU when there is one (it must keep launching while the CPU computes);
    `EDGEMOE_CPU_THREADS` overrides (a host shared with other work)."""
    override = env_whole("EDGEMOE_CPU_THREADS", 0, "threads", minimum=1)
    if override:
        return override
    cores = cpu_isa.physical_cores()
    return max(1, cores - 1) if device.type == "cuda" else cores


def kernel_computes(act: Activation) -> bool:
    """Whether the C kernel has `act` (SiLU; gpt-oss's clamped SwiGLU, its biases too)."""
    return kernel_glu(act) is not None


def quant_cpu_kernel_for(store: ExpertStore, act: Activation, device: torch.device) -> CpuExperts | None:
    """The C kernel for int8 / fp8 / int4 / mxfp4 experts (an activation it has, a compiled
    variant); None: the reference."""
    if native_weights(store.format) is None or not kernel_computes(act):
        return None
    kernel = CpuExperts(threads=cpu_threads(device))
    return kernel if kernel.native else None


def cpu_kernel_for(store: ExpertStore, act: Activation, device: torch.device) -> CpuExperts | None:
    """The C kernel when it can run these experts (bf16, an activation it has, a compiled variant);
    None: the torch path (fp32 stays bitwise equal to the device's reference kernel)."""
    if store.format.quantised or store.dtype != torch.bfloat16 or not kernel_computes(act):
        return None
    kernel = CpuExperts(threads=cpu_threads(device))
    if not kernel.native:
        return None
    return kernel
