"""The MoE executor interface and the resident executor.

Executors differ only in *where* an expert's weights are when it runs: all on the
device (resident), a slot cache fed from host memory (offload, moe/offload.py), the host
CPU for misses (cpu) or misses split between the two (hybrid, moe/cpu.py). All of them
translate a layer's routing into slot ids on the device and call the one slot-addressed
kernel (`kernels/moe_experts.py`), so every residency gives the same numbers on one
device. `moe/registry.py` builds one by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from edgemoe.kernels.moe_experts import Activation, moe_combine
from edgemoe.kernels.moe_quant import moe_slots_parts
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import ExpertStore
from edgemoe.profiling import DISABLED, StepProfiler


class MoEExecutor(ABC):
    """Contract: `forward(layer, x, topk_ids, topk_weights, residual=None)` returns
    sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) as [T, H] in x's dtype
    (plus `residual` when given, rounded as `residual + out` would be).

    Called once per MoE layer per step, in layer order, from the engine's forward
    thread only; `x` and the routing are valid only during the call. Executors keep
    state across calls (a cache, statistics) but the result never depends on it.
    Counters live where they are cheapest and are read lazily (`stats.snapshot()`).
    `close()` releases device memory and threads; the executor is unusable after.
    """

    stats: MoEStats
    profiler: StepProfiler = DISABLED  # the runtime shares its own

    @abstractmethod
    def forward(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def recover(self) -> None:
        """Forget per-step state after a forward aborted midway (device OOM)."""

    def close(self) -> None:
        """Release device memory and threads."""


class CellWorkspace:
    """The fp32 contribution cells [T, K, H], allocated once for the largest step
    (`max_tokens`; the memory plan counts it) at the first call, when K is known.
    NOTE: cells are not cleared between layers: every routed pair's cell is written
    exactly once per layer (the passes of one layer partition the pairs)."""

    def __init__(self, max_tokens: int, hidden: int, device: torch.device) -> None:
        self.max_tokens, self.hidden, self.device = max_tokens, hidden, device
        self.buffer: torch.Tensor | None = None

    def cells(self, topk_ids: torch.Tensor) -> torch.Tensor:
        T, K = topk_ids.shape
        b = self.buffer
        if b is None or T > b.shape[0] or K != b.shape[1]:
            rows = max(T, self.max_tokens)
            b = self.buffer = torch.empty((rows, K, self.hidden), dtype=torch.float32, device=self.device)
        return b[:T]


class ResidentExecutor(MoEExecutor):
    """Every expert of every layer on the compute device: slot = expert id."""

    def __init__(
        self, store: ExpertStore, device: torch.device, act: Activation, num_layers: int, max_tokens: int = 256
    ) -> None:
        self.act, self.num_experts, self.format = act, store.num_experts, store.format
        # Banks in the store's format: quantised experts stay quantised on the device.
        self.banks = {i: {n: t.to(device) for n, t in store.layer_parts(i).items()} for i in store.layers}
        self.stats = MoEStats(num_layers, first_layer=store.layers[0])
        hidden = store.down_shape[0]
        self.workspace = CellWorkspace(max_tokens, hidden, device)

    def forward(self, layer, x, topk_ids, topk_weights, residual=None):  # type: ignore[override]
        self.stats.count_tokens(layer, x.shape[0])
        self.stats.count_device_hits(layer, topk_ids, self.num_experts)
        cells = self.workspace.cells(topk_ids)
        moe_slots_parts(x, topk_ids, topk_weights, self.banks[layer], self.format, self.act, cells)
        return moe_combine(cells, x.dtype, residual)

    def close(self) -> None:
        self.banks.clear()
