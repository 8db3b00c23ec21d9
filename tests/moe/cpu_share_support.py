"""The CPU share's test material (tests/moe/test_cpu_share.py): small
stores in every weight format, a skewed routing trace, the reference split and heat, and a
layer's output computed piece by piece."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.kernels.cpu_experts import moe_expert_cells_cpu
from edgemoe.kernels.cpu_experts_quant import moe_expert_cells_q_cpu
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.kernels.moe_experts import moe_combine
from edgemoe.kernels.moe_quant import moe_slots_parts
from edgemoe.kernels.share_state import FRACTION_ONE
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.store import BankStore
from edgemoe.quant import ExpertFormat, Int4Group, Int8Channel
from edgemoe.quant.mxfp4 import Mxfp4
from edgemoe.testing.moe_material import quantised_store, random_bank_store

L, E, K, H, I = 3, 8, 2, 32, 24
CPU = torch.device("cpu")


def bf16_store() -> BankStore:
    return random_bank_store(L, E, H, I, torch.bfloat16)


def quant_store(fmt: ExpertFormat) -> PartsStore:
    return quantised_store(bf16_store(), fmt)


def store_of(kind: str) -> BankStore | PartsStore:
    """bf16 banks, or their int8 / int4 / mxfp4 (groups of 32: H = 32 one group, I = 24 a
    partial one) parts."""
    return {"bf16": bf16_store, "int8": lambda: quant_store(Int8Channel()),
            "int4": lambda: quant_store(Int4Group(32)), "mxfp4": lambda: quant_store(Mxfp4())}[kind]()


def routings(seed: int, dtype: torch.dtype, steps: int = 10):
    g = torch.Generator().manual_seed(seed)
    probs = torch.tensor([6.0, 4.0, 3.0] + [1.0] * (E - 3))  # skewed: small pools hit too
    for step in range(steps):
        T = [1, 3, 2, 7, 16][step % 5]
        ids = torch.stack([torch.multinomial(probs, K, generator=g) for _ in range(T)]).int()
        yield torch.randn(T, H, generator=g).to(dtype), ids, torch.softmax(torch.randn(T, K, generator=g), -1)


class Heat:
    """The reference selection's memory: per (layer, expert) a decayed routing count,
    integers (a routing adds 1024, each decode step keeps 7/8, rounded up)."""

    def __init__(self) -> None:
        self.heat = [[0] * E for _ in range(L)]

    def update(self, layer: int, ids: torch.Tensor) -> None:
        row = self.heat[layer]
        counts = [int((ids == e).sum()) for e in range(E)]
        self.heat[layer] = [h - (h >> 3) + 1024 * c for h, c in zip(row, counts, strict=True)]


def cpu_experts_of(slot_row: torch.Tensor, ids: torch.Tensor, quota: int, heat: list[int],
                   fraction: int = FRACTION_ONE) -> list[int]:
    """The reference split: the coldest misses (lowest heat, ties to the higher id), at
    most `quota` and `fraction` sixteenths of them, rounded half up."""
    misses = [e for e in sorted(set(ids[ids >= 0].tolist())) if slot_row[e] < 0]
    take = min(quota, (fraction * len(misses) + 8) // 16)
    return sorted(sorted(misses, key=lambda e: (heat[e], -e))[:take])


def expected(store, layer: int, x, ids, w, on_cpu: list[int], kernel: CpuExperts) -> torch.Tensor:
    """Each piece apart: every pair by the resident kernel (slot = expert id), the CPU
    experts' pairs replaced by the host path's cells, then the k-sum."""
    cells = torch.empty(*ids.shape, H)
    moe_slots_parts(x, ids, w, store.layer_parts(layer), store.format, F.silu, cells)
    if on_cpu:
        if store.format.quantised:
            parts = [store.expert_parts(layer, e) for e in on_cpu]
            flat, values = moe_expert_cells_q_cpu(x, ids, w, on_cpu, parts, store.format, kernel)
        else:
            flat, values = moe_expert_cells_cpu(x, ids, w, on_cpu, [store.expert(layer, e) for e in on_cpu], kernel)
        cells.view(-1, H)[flat] = values
    return moe_combine(cells, x.dtype)


def same_state(a: DeviceOffloadExecutor, b: DeviceOffloadExecutor) -> bool:
    ca, cb = a.cache, b.cache
    return all(torch.equal(s, t) for s, t in ((ca.slot_map, cb.slot_map), (ca.slot_owners, cb.slot_owners),
                                              (ca.recency, cb.recency), (ca.clock, cb.clock), (ca.counts, cb.counts)))
