"""Test material for the MoE executors and caches (CPU and GPU): seeded random expert
stores, and a predictor that knows a step's routing.

`random_bank_store` fills every layer's banks from one generator, scaled so a layer's
output has unit-order magnitudes (gate/up by 1/sqrt(H), down by 1/sqrt(I)) unless
`scaled=False`; `pinned=True` page-locks the banks (the device cache's gather maps them).
`quantised_store` quantises a store to a format (int8 per channel by default).
`KnownRouting`: a decode-prefetch predictor (`moe/prefetch.py`) that returns the routing
the test set for the step (an oracle).
"""

from __future__ import annotations

import torch

from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.store import BankStore
from edgemoe.quant import ExpertFormat, Int8Channel, quantise_expert


def random_bank_store(layers: int, E: int, H: int, I: int, dtype: torch.dtype = torch.float32, seed: int = 0,
                      scaled: bool = True, pinned: bool = False) -> BankStore:
    g = torch.Generator().manual_seed(seed)
    store = BankStore.allocate(list(range(layers)), E, H, I, dtype)
    for bank in store.banks.values():
        bank.gate_up.copy_(torch.randn(bank.gate_up.shape, generator=g) / (H**0.5 if scaled else 1.0))
        bank.down.copy_(torch.randn(bank.down.shape, generator=g) / (I**0.5 if scaled else 1.0))
    if not pinned:
        return store
    banks = {i: type(b)(b.gate_up.pin_memory(), b.down.pin_memory()) for i, b in store.banks.items()}
    return BankStore(banks, pinned=True)


def quantised_store(store: BankStore, fmt: ExpertFormat | None = None) -> PartsStore:
    """`store`'s experts quantised to `fmt` (default int8 per channel), expert by expert."""
    fmt, layers = fmt or Int8Channel(), sorted(store.banks)
    first = store.banks[layers[0]]
    E, H, I = first.down.shape
    parts = PartsStore.allocate_parts(layers, E, H, I, fmt)
    for layer in layers:
        bank = store.banks[layer]
        for e in range(E):
            for name, t in quantise_expert(fmt, bank.gate_up[e, :I].float(), bank.gate_up[e, I:].float(),
                                           bank.down[e].float()).items():
                parts.banks[layer][name][e].copy_(t)
    return parts


class KnownRouting:
    """A prefetch predictor answering each layer's ids from `step` (layer → [T, K] int32)."""

    label = "test oracle"

    def __init__(self) -> None:
        self.step: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, x: torch.Tensor, like: torch.Tensor, source: int | None = None) -> torch.Tensor:
        return self.step[layer]

    def prepare(self, pairs: list[tuple[int, int]]) -> None:
        pass
