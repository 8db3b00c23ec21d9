"""The PLE store contract, and the device store.

A store holds the PLE tables of every PLE layer and brings a step's rows to the device.
The model hashes each step's n-grams on the device (`ple/inputs.py`) and asks the store
for each PLE layer's rows; a store that fills rows on the host (the disk store) hashes
on the host instead, from the step's chunks, before the forward (`begin_step`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

import torch

from edgemoe.ple.geometry import PleGeometry


class StepChunk(Protocol):
    """What a store that hashes on the host reads of a scheduled chunk (engine's `SeqChunk`)."""

    start: int  # position of the chunk's first token
    token_ids: Sequence[int]
    context: Sequence[int]  # the tokens before `start`, up to ngram_size - 1 of them


class PleFillError(RuntimeError):
    """A step's PLE rows could not be read (the disk store): the step fails, never with stale rows."""


class PleStore(ABC):
    """Contract:
    - `begin_step(chunks)`: on the engine thread, before the step's forward, with the step's
      chunks in batch order (padding included). Stores whose rows are filled on the host
      start or collect those fills here; a fill that failed raises here (never stale rows).
    - `gather(j, ids, T)`: device work only (capturable in a CUDA graph when `graph_safe`):
      rows [T, heads, d] of PLE layer j's table for `ids` [T, heads] (table rows, int64, on
      the device; None when `hashes_on_device` is False: the rows `begin_step` brought).
    - `end_step()`: after the step's device work is enqueued (stream order): a store may
      recycle what the step read once the device is done with it.
    """

    hashes_on_device = True
    graph_safe = True

    def __init__(self, geometry: PleGeometry) -> None:
        self.geometry = geometry

    def begin_step(self, chunks: Sequence[StepChunk]) -> None:  # noqa: B027 - optional hook
        """Prepare the step's rows (default: nothing; the forward gathers on the device)."""

    def end_step(self) -> None:  # noqa: B027 - optional hook
        """The step's device work is enqueued (default: nothing)."""

    @abstractmethod
    def gather(self, j: int, ids: torch.Tensor | None, num_tokens: int) -> torch.Tensor: ...

    def prefetch(self, chunks: Sequence[StepChunk]) -> None:  # noqa: B027 - optional hook
        """Chunks a coming step will compute: a store filling rows on the host may start now."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work (the disk store's filler)."""


class DeviceStore(PleStore):
    """`--ple-store device`: every table on the device; a gather is an index_select."""

    def __init__(self, geometry: PleGeometry, tables: Sequence[torch.Tensor]) -> None:
        super().__init__(geometry)
        self.tables = list(tables)  # [rows_j, d] per PLE layer, on the device

    def gather(self, j: int, ids: torch.Tensor | None, num_tokens: int) -> torch.Tensor:
        assert ids is not None
        return self.tables[j].index_select(0, ids.reshape(-1)).view(*ids.shape, -1)
