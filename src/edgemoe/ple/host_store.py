"""`--ple-store host`: the PLE tables in host RAM, page-locked in place and mapped into the
device's address space, gathered by a device kernel over PCIe (a step reads a few KiB per
token); on a machine without a GPU, plain RAM and an index_select.

The device reads the tables through `moe/pinning.uva_view` (a CUDA tensor aliasing the
page-locked host memory); the store keeps both the host tensors and the views.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from edgemoe.kernels.row_gather import gather_rows
from edgemoe.moe.pinning import InPlacePinner, Registrar, uva_view
from edgemoe.ple.geometry import PleGeometry
from edgemoe.ple.store import PleStore


class HostStore(PleStore):
    """Contract as `PleStore`; `tables` are contiguous host tensors [rows_j, d] (filled)."""

    def __init__(
        self, geometry: PleGeometry, tables: Sequence[torch.Tensor], device: torch.device,
        registrar: Registrar | None = None,
    ) -> None:
        super().__init__(geometry)
        self.host, self.device, self.pinner = list(tables), device, None
        self.tables = self.host
        if device.type == "cuda":
            if registrar is None:
                raise ValueError("the host PLE store on a GPU needs a registrar to page-lock its tables")
            self.pinner = InPlacePinner(registrar, "PLE tables")
            for t in self.host:
                self.pinner.submit(t)
            if not self.pinner.finish():
                raise RuntimeError("--ple-store host: the PLE tables could not be page-locked (raise the memlock "
                                   "limit, or use --ple-store disk)")
            self.tables = [uva_view(t, device) for t in self.host]

    def gather(self, j: int, ids: torch.Tensor | None, num_tokens: int) -> torch.Tensor:
        assert ids is not None
        return gather_rows(self.tables[j], ids).view(*ids.shape, -1)

    def close(self) -> None:
        self.tables = []
        if self.pinner is not None:
            self.pinner.release()
            self.pinner = None

    @property
    def pinned_bytes(self) -> int:
        return sum(t.nbytes for t in self.host) if self.pinner is not None else 0
