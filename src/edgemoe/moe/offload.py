"""Offload: a global pool of device slots caches experts; misses are copied in.

`SlotBanks` owns the device slot tensors and the host→device copies; `SlotCache`
(slots.py) decides which expert sits in which slot. A layer whose routed set exceeds
the pool runs in waves: copy a wave's misses, compute it, go on.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.moe_experts import Activation, moe_combine, moe_experts_partial
from edgemoe.moe.executor import MoEExecutor, new_contrib, routed_experts
from edgemoe.moe.slots import LayerWave, SlotCache
from edgemoe.moe.stats import MoEStats
from edgemoe.moe.store import ExpertStore


class SlotBanks:
    """Device tensors gate_up [S, 2I, H] and down [S, H, I], filled from the store.

    Copies are issued on the current stream (so compute that follows sees them);
    from pinned host memory they run on the copy engine asynchronously.
    """

    def __init__(self, store: ExpertStore, num_slots: int, device: torch.device, stats: MoEStats) -> None:
        self.store, self.device, self.stats = store, device, stats
        self.gate_up = torch.empty((num_slots, *store.gate_up_shape), dtype=store.dtype, device=device)
        self.down = torch.empty((num_slots, *store.down_shape), dtype=store.dtype, device=device)
        self.expert_nbytes = store.expert_nbytes
        self._timed = device.type == "cuda"

    def load(self, layer: int, wave: LayerWave) -> None:
        if not wave.misses:
            return
        start = torch.cuda.Event(enable_timing=True) if self._timed else None
        if start is not None:
            start.record()
        for miss in wave.misses:
            gate_up, down = self.store.expert(layer, miss.expert)
            self.gate_up[miss.slot].copy_(gate_up, non_blocking=True)
            self.down[miss.slot].copy_(down, non_blocking=True)
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.stats.add_copy_interval(start, end)
        self.stats.bytes_copied += len(wave.misses) * self.expert_nbytes

    def nbytes(self) -> int:
        return self.gate_up.nbytes + self.down.nbytes


class OffloadExecutor(MoEExecutor):
    def __init__(
        self,
        store: ExpertStore,
        device: torch.device,
        act: Activation,
        num_layers: int,
        num_slots: int,
        policy: str = "lru",
    ) -> None:
        self.act = act
        self.stats = MoEStats(num_layers, first_layer=store.layers[0])
        self.cache = SlotCache(num_slots, num_layers, store.num_experts, policy)
        self.slots = SlotBanks(store, num_slots, device, self.stats)

    def run_waves(
        self, layer: int, experts: list[int], x: torch.Tensor, topk_ids: torch.Tensor,
        topk_weights: torch.Tensor, contrib: torch.Tensor,
    ) -> None:
        """Load and compute `experts` of `layer` through the slot cache, wave by wave."""
        with self.cache.layer_waves(layer, experts) as waves:
            for wave in waves:
                self.stats.hits[layer] += wave.num_hits
                self.stats.misses[layer] += len(wave.misses)
                self.slots.load(layer, wave)
                moe_experts_partial(
                    x, topk_ids, topk_weights, wave.experts, wave.slots,
                    self.slots.gate_up, self.slots.down, self.act, contrib,
                )

    def forward(self, layer, x, topk_ids, topk_weights):  # type: ignore[override]
        self.stats.count_tokens(layer, x.shape[0])
        contrib = new_contrib(topk_ids, x)
        self.run_waves(layer, routed_experts(topk_ids), x, topk_ids, topk_weights, contrib)
        return moe_combine(contrib, x.dtype)

    def recover(self) -> None:
        # A layer aborted between plan and release leaves its experts pinned; copies
        # that never landed would leave slots mapped to stale weights, so drop them all.
        self.cache.clear()

    def close(self) -> None:
        del self.slots
