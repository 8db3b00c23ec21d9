"""Host expert store: every routed expert of every MoE layer as stacked [E, ...] banks.

The loader writes checkpoint tensors straight into these banks (no second copy), so a
bank row *is* the expert: the slot cache and executors address experts by index.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass
class ExpertBank:
    """One layer's experts: gate_up [E, 2I, H] (gate rows first), down [E, H, I]."""

    gate_up: torch.Tensor
    down: torch.Tensor

    @property
    def num_experts(self) -> int:
        return int(self.gate_up.shape[0])

    @property
    def expert_nbytes(self) -> int:
        return (self.gate_up[0].numel() + self.down[0].numel()) * self.gate_up.element_size()


class ExpertStore:
    """Banks by layer index (only MoE layers have one)."""

    def __init__(self, banks: dict[int, ExpertBank]) -> None:
        self.banks = banks

    @classmethod
    def allocate(
        cls,
        moe_layers: list[int],
        num_experts: int,
        hidden: int,
        intermediate: int,
        dtype: torch.dtype,
        pin: bool = False,
    ) -> ExpertStore:
        """Empty banks to be filled in place. `pin`: page-locked host memory, so copies
        to the device run asynchronously on the copy engine; if the OS refuses (memlock
        limits, low RAM), pageable memory with one warning."""
        try:
            return cls(_banks(moe_layers, num_experts, hidden, intermediate, dtype, pin))
        except RuntimeError as e:
            if not pin:
                raise
            log.warning("pinning the expert store failed (%s); using pageable memory (slower copies)", e)
            return cls(_banks(moe_layers, num_experts, hidden, intermediate, dtype, False))

    def tensor(self, layer: int, which: str) -> torch.Tensor:
        return getattr(self.banks[layer], which)

    def nbytes(self) -> int:
        return sum(b.gate_up.nbytes + b.down.nbytes for b in self.banks.values())


def _banks(
    layers: list[int], num_experts: int, hidden: int, inter: int, dtype: torch.dtype, pin: bool
) -> dict[int, ExpertBank]:
    return {
        i: ExpertBank(
            gate_up=torch.empty(num_experts, 2 * inter, hidden, dtype=dtype, pin_memory=pin),
            down=torch.empty(num_experts, hidden, inter, dtype=dtype, pin_memory=pin),
        )
        for i in layers
    }
