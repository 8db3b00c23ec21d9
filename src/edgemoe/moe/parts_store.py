"""Quantised experts in host RAM: one stacked bank per part of the format.

For fp8 a layer holds gate_up [E, 2I, H] e4m3, gate_up_scale [E, 2·ceil(I/B), ceil(H/B)],
down [E, H, I] and down_scale; for int4 the packed nibbles, fp16 scales and zero points
(`edgemoe.quant.expert_specs`). Experts stay in this form in the store, in the device
slots and over PCIe; kernels dequantise on the fly. Written in place by the loader (a
published checkpoint's tensors repacked, or bf16 weights quantised as they stream in).
"""

from __future__ import annotations

import logging

import torch

from edgemoe.moe.store import BankStore
from edgemoe.quant import ExpertFormat, Parts, expert_nbytes, expert_specs

log = logging.getLogger(__name__)


class PartsStore(BankStore):
    """Quantised banks: `banks[layer][part]` [E, ...]; page-locking as `BankStore`."""

    def __init__(self, banks: dict[int, Parts], fmt: ExpertFormat, hidden: int, inter: int,
                 pinned: bool = False) -> None:
        self.banks = banks  # type: ignore[assignment]
        self.pinned = pinned
        self._unpin = None
        self._format = fmt
        self.layers = sorted(banks)
        first = banks[self.layers[0]]
        self.num_experts = int(first["gate_up"].shape[0])
        self.dtype = first["gate_up"].dtype  # the data part's (e4m3, int8, uint8 nibbles)
        self.gate_up_shape, self.down_shape = (2 * inter, hidden), (hidden, inter)

    @classmethod
    def allocate_parts(cls, moe_layers: list[int], num_experts: int, hidden: int, inter: int,
                       fmt: ExpertFormat, pin: bool = False) -> PartsStore:
        """Empty banks to fill in place (pinned when `pin`; pageable with a warning if refused)."""
        specs = expert_specs(fmt, hidden, inter)

        def banks(pinned: bool) -> dict[int, Parts]:
            return {i: {name: torch.empty((num_experts, *shape), dtype=dt, pin_memory=pinned)
                        for name, (shape, dt) in specs.items()} for i in moe_layers}

        try:
            return cls(banks(pin), fmt, hidden, inter, pinned=pin)
        except RuntimeError as e:
            if not pin:
                raise
            log.warning("pinning the expert store failed (%s); using pageable memory (slower copies)", e)
            return cls(banks(False), fmt, hidden, inter)

    @property
    def format(self) -> ExpertFormat:
        return self._format

    @property
    def expert_nbytes(self) -> int:
        (two_i, hidden) = self.gate_up_shape
        return expert_nbytes(self._format, hidden, two_i // 2)

    def tensor(self, layer: int, which: str) -> torch.Tensor:
        return self.banks[layer][which]  # type: ignore[index]

    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError(f"the expert store holds {self._format.label} experts: read them with expert_parts()")

    def layer_banks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError(f"the expert store holds {self._format.label} experts: read them with layer_parts()")

    def expert_parts(self, layer: int, e: int) -> Parts:
        return {name: bank[e] for name, bank in self.banks[layer].items()}  # type: ignore[union-attr]

    def layer_parts(self, layer: int) -> Parts:
        return dict(self.banks[layer])  # type: ignore[arg-type]

    def part_tensors(self) -> list[torch.Tensor]:
        """Every bank tensor (for page-locking in place)."""
        return [t for bank in self.banks.values() for t in bank.values()]  # type: ignore[union-attr]
