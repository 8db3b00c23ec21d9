"""Decode prefetch's bookkeeping as one launch each (see `kernels/prefetch_marks.py`): the
same values as the torch reference. One program each: the lists are a decode step's
(≤ 64 rows x top-k) and the masks one pool's and one layer's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import pdl_start

CHUNK = 16  # routed pairs compared against every expert at once (registers: CHUNK x BLOCK_E)
CHUNK_N = 1024  # list entries scattered at once


@triton.jit
def _prefetch_pins(slots_ptr, routed_ptr, loaded_ptr, used_ptr, pins_ptr, N, E, S, COUNT: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK: tl.constexpr, CHUNK_N: tl.constexpr,
                   USE_PDL: tl.constexpr):
    pdl_start(USE_PDL)
    s = tl.arange(0, BLOCK_S)
    tl.store(pins_ptr + s, tl.zeros([BLOCK_S], tl.uint8), mask=s < S)
    tl.debug_barrier()  # the zeros land before any thread's ones
    for n0 in range(0, N, CHUNK_N):
        n = n0 + tl.arange(0, CHUNK_N)
        slot = tl.load(slots_ptr + n, mask=n < N, other=-1)
        tl.store(pins_ptr + slot, tl.full([CHUNK_N], 1, tl.uint8), mask=slot >= 0)  # duplicates write the same 1
    if COUNT:
        e = tl.arange(0, BLOCK_E)
        seen = tl.zeros([BLOCK_E], tl.int32)
        for n0 in range(0, N, CHUNK):
            nc = n0 + tl.arange(0, CHUNK)
            ids = tl.load(routed_ptr + nc, mask=nc < N, other=-1)
            seen = tl.maximum(seen, tl.max((ids[:, None] == e[None, :]).to(tl.int32), axis=0))
        loaded = tl.load(loaded_ptr + e, mask=e < E, other=0)
        used = tl.sum(((seen > 0) & (loaded != 0)).to(tl.int64), axis=0)
        tl.store(used_ptr, tl.load(used_ptr) + used)


@triton.jit
def _prefetch_marks(misses_ptr, out_ptr, in_flight_ptr, loaded_ptr, count_ptr, M, stride_out, E, S,
                    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_start(USE_PDL)
    s = tl.arange(0, BLOCK_S)
    tl.store(in_flight_ptr + s, tl.zeros([BLOCK_S], tl.uint8), mask=s < S)
    e = tl.arange(0, BLOCK_E)
    tl.store(loaded_ptr + e, tl.zeros([BLOCK_E], tl.uint8), mask=e < E)
    m = tl.arange(0, BLOCK_M)
    expert = tl.load(misses_ptr + m, mask=m < M, other=-1)
    slot = tl.load(misses_ptr + M + m, mask=m < M, other=-1)
    tl.store(out_ptr + m, expert, mask=m < M)
    tl.store(out_ptr + stride_out + m, slot, mask=m < M)
    tl.debug_barrier()  # the zeros land before any thread's ones
    tl.store(in_flight_ptr + slot, tl.full([BLOCK_M], 1, tl.uint8), mask=slot >= 0)
    tl.store(loaded_ptr + expert, tl.full([BLOCK_M], 1, tl.uint8), mask=expert >= 0)
    tl.store(count_ptr, tl.load(count_ptr) + tl.sum((expert >= 0).to(tl.int64), axis=0))


def prefetch_pins_triton(slot_ids: torch.Tensor, pins: torch.Tensor, routed: torch.Tensor | None,
                         loaded: torch.Tensor | None, used: torch.Tensor | None) -> None:
    slots = slot_ids.reshape(-1).contiguous()
    count = used is not None
    E = loaded.numel() if count else 1
    assert pins.is_contiguous() and (not count or (routed.numel() == slots.numel() and loaded.is_contiguous()))
    ids = routed.reshape(-1).contiguous() if count else slots
    pdl = pdl_enabled(slots.device)
    # NOTE: without COUNT the kernel reads none of routed / loaded / used: pins stand in for them.
    _prefetch_pins[(1,)](slots, ids, loaded.view(torch.uint8) if count else pins.view(torch.uint8),
                         used if count else pins, pins.view(torch.uint8), slots.numel(), E, pins.numel(),
                         COUNT=count, BLOCK_E=triton.next_power_of_2(E), BLOCK_S=triton.next_power_of_2(pins.numel()),
                         CHUNK=CHUNK, CHUNK_N=CHUNK_N, USE_PDL=pdl, launch_pdl=pdl)


def prefetch_marks_triton(misses: torch.Tensor, out: torch.Tensor, in_flight: torch.Tensor, loaded: torch.Tensor,
                          prefetched: torch.Tensor) -> None:
    M = misses.shape[1]
    assert misses.is_contiguous() and out.shape == misses.shape and out.stride(1) == 1
    assert in_flight.is_contiguous() and loaded.is_contiguous()
    pdl = pdl_enabled(misses.device)
    _prefetch_marks[(1,)](misses, out, in_flight.view(torch.uint8), loaded.view(torch.uint8), prefetched, M,
                          out.stride(0), loaded.numel(), in_flight.numel(), BLOCK_M=triton.next_power_of_2(M),
                          BLOCK_E=triton.next_power_of_2(loaded.numel()),
                          BLOCK_S=triton.next_power_of_2(in_flight.numel()), USE_PDL=pdl, launch_pdl=pdl)
