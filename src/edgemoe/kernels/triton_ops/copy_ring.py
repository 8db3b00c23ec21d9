"""The copier's ring from inside a launch (`kernels/copy_bell.py`, `kernels/cpu/em_copier.h`):
one program clears the row's done word, writes the miss list into the page-locked row, and
publishes the flag with release semantics at system scope (`host_words.publish`), so the C
thread that sees the flag reads the whole row. Same values as `copy_bell.publish_ref`."""

from __future__ import annotations

import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.common import interpreting
from edgemoe.kernels.triton_ops.host_words import publish

HEADER = 2


@triton.jit
def _ring(misses_ptr, stride, m, layer, row_ptr, flag_ptr, done_ptr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
          HDR: tl.constexpr, INTERP: tl.constexpr):
    tl.store(done_ptr, 0)
    offs = tl.arange(0, BLOCK)
    inside = offs < m
    ids = tl.load(misses_ptr + offs, mask=inside, other=-1)
    slots = tl.load(misses_ptr + stride + offs, mask=inside, other=-1)
    keep = offs < WIDTH
    tl.store(row_ptr + HDR + offs, ids, mask=keep)
    tl.store(row_ptr + HDR + WIDTH + offs, slots, mask=keep)
    tl.store(row_ptr, layer)
    tl.store(row_ptr + 1, 0)
    publish(flag_ptr, 1, INTERP)


def publish_triton(misses, layer: int, row, flag, done) -> None:  # noqa: ANN001 - tensors
    width = (row.numel() - HEADER) // 2
    _ring[(1,)](misses, misses.stride(0), misses.shape[1], layer, row, flag, done, WIDTH=width,
                BLOCK=triton.next_power_of_2(max(width, 1)), HDR=HEADER, INTERP=interpreting(misses))
