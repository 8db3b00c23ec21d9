"""The token embedding kept in host memory (`--embed-weights host`, or `auto` where the
experts don't all fit on the device: engine/device_plan.py): the table stays in
pinned RAM, mapped into the device's address space, and each step gathers its tokens'
rows over PCIe (a few KiB per token: H · dtype bytes each), so the table's device memory
(0.95 GiB for a 248K × 2048 bf16 vocabulary) goes to expert slots instead. On a machine
without a GPU the table is plain RAM and the gather an index_select.

The gather (`kernels/row_gather.py`) computes 64-bit offsets, takes fixed shapes and reads
nothing back: a CUDA graph holds it. Rows are copied bit for bit: the same values as an
embedding on the device.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.row_gather import gather_rows
from edgemoe.moe.pinning import InPlacePinner, Registrar, uva_view


class HostEmbedding:
    """Callable ids [T] → rows [T, H] on `device`; owns the table's page-locking."""

    def __init__(self, table: torch.Tensor, device: torch.device, registrar: Registrar | None) -> None:
        self.host, self.device, self.pinner = table.contiguous(), device, None
        self.table = self.host
        if device.type == "cuda":
            if registrar is None:
                raise ValueError("--embed-weights host on a GPU needs a registrar to page-lock the table")
            self.pinner = InPlacePinner(registrar, "token embedding")
            self.pinner.submit(self.host)
            if not self.pinner.finish():
                raise RuntimeError("--embed-weights host/auto: the token embedding could not be page-locked; "
                                   "use --embed-weights device")
            self.table = uva_view(self.host, device)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return gather_rows(self.table, ids.long())

    @property
    def pinned_bytes(self) -> int:
        return self.host.nbytes if self.pinner is not None else 0

    def close(self) -> None:
        if self.pinner is not None:
            self.pinner.release()
            self.pinner = None
