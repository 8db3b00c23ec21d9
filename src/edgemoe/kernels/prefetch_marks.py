"""Decode prefetch's bookkeeping per layer (`moe/prefetch.py`), two launches around its plan
instead of ~20 small torch ops on the decode step's serial chain:

- `prefetch_pins` (before the plan of layer l+1's predicted experts): `pins` [S] = the
  slots of layer l's routing `slot_ids` (the plan may not evict what l still reads), and,
  when `used` is given, `used` += the experts of l's routing `routed` that l's own
  prefetch brought (`loaded` [E]): the prefetch's precision.
- `prefetch_marks` (after that plan): its miss list `misses` [2, M] copied into `out` (a
  static buffer the side stream reads), `in_flight` [S] = its slots (the next plan of
  that layer pins them), `loaded` [E] = its experts, `prefetched` += their number.

The torch functions are the reference and the CPU path; on CUDA each is one Triton launch
(`triton_ops/prefetch_marks.py`), the same values. Fixed shapes, no host read: capturable.
Masks are bool tensors; -1 entries of any list are ignored.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.backend import triton_importable
from edgemoe.kernels.slot_plan import present


def _mark(out: torch.Tensor, ids: torch.Tensor) -> None:
    """out [n] bool = which of 0..n-1 occur in ids."""
    out.copy_(present(ids, out.numel()))


def prefetch_pins_ref(slot_ids: torch.Tensor, pins: torch.Tensor, routed: torch.Tensor | None = None,
                      loaded: torch.Tensor | None = None, used: torch.Tensor | None = None) -> None:
    _mark(pins, slot_ids)
    if used is not None:
        assert routed is not None and loaded is not None
        seen = torch.zeros_like(loaded)
        _mark(seen, routed)
        used += (seen & loaded).sum()


def prefetch_marks_ref(misses: torch.Tensor, out: torch.Tensor, in_flight: torch.Tensor, loaded: torch.Tensor,
                       prefetched: torch.Tensor) -> None:
    out.copy_(misses)
    _mark(in_flight, misses[1])
    _mark(loaded, misses[0])
    prefetched += (misses[0] >= 0).sum()


def prefetch_pins(slot_ids: torch.Tensor, pins: torch.Tensor, routed: torch.Tensor | None = None,
                  loaded: torch.Tensor | None = None, used: torch.Tensor | None = None) -> None:
    """`pins` = the slots of `slot_ids`; `used` (0-d int64, optional) += |routed ∩ loaded|."""
    if slot_ids.is_cuda and triton_importable():
        from edgemoe.kernels.triton_ops.prefetch_marks import prefetch_pins_triton

        prefetch_pins_triton(slot_ids, pins, routed, loaded, used)
        return
    prefetch_pins_ref(slot_ids, pins, routed, loaded, used)


def prefetch_marks(misses: torch.Tensor, out: torch.Tensor, in_flight: torch.Tensor, loaded: torch.Tensor,
                   prefetched: torch.Tensor) -> None:
    """`out` [2, M] = misses; `in_flight` = its slots, `loaded` = its experts; `prefetched`
    (0-d int64) += its length."""
    if misses.is_cuda and triton_importable():
        from edgemoe.kernels.triton_ops.prefetch_marks import prefetch_marks_triton

        prefetch_marks_triton(misses, out, in_flight, loaded, prefetched)
        return
    prefetch_marks_ref(misses, out, in_flight, loaded, prefetched)
