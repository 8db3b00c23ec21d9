"""The CPU share's device-side buffers for the share_split tests (the interpreter's on CPU
tensors, tests/kernels/test_share_split.py; the compiled kernel's, tests/gpu/test_share_split_gpu.py)."""

from __future__ import annotations

import torch

from edgemoe.kernels.cpu_host_layer import MailboxBuffers
from edgemoe.kernels.share_state import FRACTION_ONE, ShareState


def mailbox(rows: int, cap: int, hidden: int, device: str = "cpu") -> MailboxBuffers:
    """A mailbox of `cap` columns (the last the trash) over `rows` token rows; its CPU cells
    random (seeded), its pairs -7 where nothing was written."""
    return MailboxBuffers(
        count=torch.zeros(1, dtype=torch.int32, device=device),
        pairs=torch.full((3, cap), -7, dtype=torch.int32, device=device),
        weights=torch.zeros(cap, device=device), x=torch.zeros(rows, hidden, dtype=torch.bfloat16, device=device),
        out=torch.randn(cap, hidden, generator=torch.Generator().manual_seed(cap)).to(device),
        scratch=torch.zeros(8, dtype=torch.uint8, device=device),
    )


def state(E: int, pairs: int, resident: torch.Tensor, quota: int, rates: tuple[int, int, int, int] = (0, 0, 0, 0),
          device: str = "cpu", fraction: int = FRACTION_ONE) -> ShareState:
    """One layer's share state for steps of up to `pairs` pairs: no heat yet, `quota`
    coldest misses and `fraction` sixteenths of them (decode), `rates` (prompt)."""
    return ShareState(resident.to(device), torch.zeros(E, dtype=torch.int64, device=device),
                      torch.tensor(quota, device=device), torch.tensor(fraction, device=device),
                      torch.tensor(1024, device=device),
                      torch.zeros((), dtype=torch.int64, device=device),
                      torch.full((pairs,), -7, dtype=torch.int32, device=device),
                      torch.zeros(E, dtype=torch.int32, device=device), torch.tensor(rates, device=device))
