"""Host expert stores: where every routed expert of every MoE layer lives on the host.

`ExpertStore` is the interface the executors read; two implementations:
- `BankStore`: stacked [E, 2I, H] / [E, H, I] banks per layer in RAM (page-locked when
  a GPU is used), written in place by the loader, so a bank row *is* the expert;
- `MmapStore` (mmap_store.py): views straight into the checkpoint's safetensors files,
  for hosts with less RAM than the model (the page cache holds what is hot);
- `PartsStore` (parts_store.py): quantised experts, one bank per part of the format
  (data, scales, zero points), e.g. fp8 or int4 straight from the checkpoint.

Every store has a `format` (`edgemoe.quant`): unquantised stores are `Dense(dtype)`,
whose parts are just "gate_up" and "down".
"""

from __future__ import annotations

import logging
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from edgemoe.moe.pinning import InPlacePinner
from edgemoe.quant import Dense, ExpertFormat, Parts

log = logging.getLogger(__name__)


class ExpertStore(ABC):
    """Read-only access to host experts by (layer, expert id).

    Contract: tensors returned are host tensors valid until the store is dropped; they
    may be views into shared memory (never write to them). `expert()` may allocate
    (an mmap store concatenates gate and up), so hot paths copy from it once.
    """

    layers: list[int]  # MoE layer indices, ascending
    num_experts: int
    dtype: torch.dtype
    gate_up_shape: tuple[int, int]  # [2I, H], gate rows first
    down_shape: tuple[int, int]  # [H, I]

    @property
    def format(self) -> ExpertFormat:
        """How the experts are stored (unquantised stores: `Dense` in their dtype)."""
        return Dense(self.dtype)

    @property
    def expert_nbytes(self) -> int:
        (a, b), (c, d) = self.gate_up_shape, self.down_shape
        return (a * b + c * d) * self.dtype.itemsize

    def nbytes(self) -> int:
        return len(self.layers) * self.num_experts * self.expert_nbytes

    @abstractmethod
    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I, H], down [H, I]) of one expert."""

    def layer_banks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All experts of a layer stacked: ([E, 2I, H], [E, H, I]) (a copy by default)."""
        pairs = [self.expert(layer, e) for e in range(self.num_experts)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    def expert_parts(self, layer: int, e: int) -> Parts:
        """One expert in its format's parts (`edgemoe.quant.expert_specs`): every store
        answers this; `expert()` only unquantised ones."""
        gate_up, down = self.expert(layer, e)
        return {"gate_up": gate_up, "down": down}

    def layer_parts(self, layer: int) -> Parts:
        """All experts of a layer, each part stacked [E, ...]."""
        gate_up, down = self.layer_banks(layer)
        return {"gate_up": gate_up, "down": down}

    def close(self) -> None:
        """Give back what the store holds beyond its memory (page-locking); idempotent."""


@dataclass
class ExpertBank:
    """One layer's experts: gate_up [E, 2I, H] (gate rows first), down [E, H, I]."""

    gate_up: torch.Tensor
    down: torch.Tensor


class BankStore(ExpertStore):
    """Stacked banks in host RAM, filled in place by the loader.

    `pinned`: the banks are page-locked, registered in place by an `InPlacePinner` this
    store then owns (unregistered by `close()` or when collected).
    """

    def __init__(self, banks: dict[int, ExpertBank], pinned: bool = False) -> None:
        self.banks = banks
        self.pinned = pinned
        self._unpin: weakref.finalize | None = None
        first = banks[min(banks)]
        self.layers = sorted(banks)
        self.num_experts = int(first.gate_up.shape[0])
        self.dtype = first.gate_up.dtype
        self.gate_up_shape = tuple(first.gate_up.shape[1:])  # type: ignore[assignment]
        self.down_shape = tuple(first.down.shape[1:])  # type: ignore[assignment]

    @classmethod
    def allocate(
        cls,
        moe_layers: list[int],
        num_experts: int,
        hidden: int,
        intermediate: int,
        dtype: torch.dtype,
    ) -> BankStore:
        """Empty pageable banks to be filled in place, exactly their size. Page-locking
        is done in place once a bank is filled (`own_pins`): a pinned allocation would
        round sizes up and cannot overlap the filling."""
        return cls(_banks(moe_layers, num_experts, hidden, intermediate, dtype))

    def own_pins(self, pinner: InPlacePinner) -> None:
        """Take over `pinner`'s finished registrations of these banks."""
        self.pinned = pinner.finish()
        # NOTE: a finalizer, not __del__: it runs before the banks can be freed, and the
        # pinner holds them until it has unregistered them.
        self._unpin = weakref.finalize(self, pinner.release)
        self._unpin.atexit = False  # at exit the process's memory goes anyway

    def close(self) -> None:
        """Unregister in-place pinned banks now (they become pageable); idempotent."""
        if self._unpin is not None:
            self._unpin()
            self.pinned = False

    def tensor(self, layer: int, which: str) -> torch.Tensor:
        return getattr(self.banks[layer], which)

    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        bank = self.banks[layer]
        return bank.gate_up[e], bank.down[e]

    def layer_banks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        bank = self.banks[layer]
        return bank.gate_up, bank.down


def _banks(layers: list[int], num_experts: int, hidden: int, inter: int, dtype: torch.dtype) -> dict[int, ExpertBank]:
    return {
        i: ExpertBank(
            gate_up=torch.empty(num_experts, 2 * inter, hidden, dtype=dtype),
            down=torch.empty(num_experts, hidden, inter, dtype=dtype),
        )
        for i in layers
    }
