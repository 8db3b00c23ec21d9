"""The device expert cache's plan of one wave, fused: one Triton launch instead of ~75
small torch ops (`moe/device_cache.py`'s `plan_wave`, which stays the reference and the
path on CPU; its tests prove it equal to `SlotCache` + its policy;
tests/kernels/test_slot_plan.py proves this kernel equal to it: outputs and every state
tensor, wave by wave).

Contract (`plan_wave_fused`): given the cache's state tensors (`SlotState`, updated in
place), a layer, its routing `[T, K]` (-1 = not routed) and optional `pinned` [S] bool
slots, it makes the decisions and updates of `DeviceSlotCache.plan_wave` (`scan`: the
scan-resistant "lru" order of victims, else "lru-plain"'s) and returns its outputs
(`FusedPlan`). One program, fixed shapes, no host read: capturable in a CUDA graph. The
cost per wave is in `triton_ops/slot_plan.py` (2·S int64 reads, one block reduction over
the pool per victim).

Chosen on CUDA tensors when Triton is importable and the pool fits the kernel's
registers (`fused_plan_supported`); `EDGEMOE_TRITON=0` keeps the torch ops (A/B runs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from edgemoe.env_switch import env_switch
from edgemoe.kernels.backend import triton_importable

# The kernel holds the pool's keys (int64) and the layer's experts in one CTA's registers.
MAX_SLOTS = 16384
MAX_EXPERTS = 4096
# The victim sort keys (NEVER, FRESH) are `kernels/slot_keys.py`'s.


class SlotState(NamedTuple):
    """The cache's device state, updated in place (all contiguous)."""

    slot_map: torch.Tensor  # [L, E] int32, -1 = not resident
    owners: torch.Tensor  # [S] int64, layer·E + expert, -1 = free
    recency: torch.Tensor  # [S] int64
    clock: torch.Tensor  # [] int64, the next recency value
    counts: torch.Tensor  # [L, 2] int64 (hits, misses)
    events: torch.Tensor  # [L, E] uint8
    wave_end: torch.Tensor  # [L] int64, the clock after each layer's last non-empty wave


class FusedPlan(NamedTuple):
    """`WavePlan`'s fields (moe/device_cache.py): slot_ids [N] int32 (flat), hits [E] bool,
    misses [2, M] int32, overflow [] bool."""

    slot_ids: torch.Tensor
    hits: torch.Tensor
    misses: torch.Tensor
    overflow: torch.Tensor


def present(ids: torch.Tensor, n: int) -> torch.Tensor:
    """[n] bool: which of 0..n-1 occur in `ids` (any shape; -1 entries ignored). Shape-static:
    a masked fill through a trailing trash entry, no host read (the device cache's "which
    experts / slots does this list name", used by its plan's users)."""
    flat = ids.reshape(-1).long()
    out = torch.zeros(n + 1, dtype=torch.bool, device=ids.device)
    out.index_fill_(0, torch.where(flat >= 0, flat, n), True)
    return out[:n]


def fused_plan_supported(device: torch.device, num_slots: int, num_experts: int) -> bool:
    """Whether the cache on `device` should plan with the fused kernel by default."""
    if not env_switch("EDGEMOE_TRITON", True):
        return False
    fits = num_slots <= MAX_SLOTS and num_experts <= MAX_EXPERTS
    return torch.device(device).type == "cuda" and fits and triton_importable()


def plan_wave_fused(
    state: SlotState,
    layer: int,
    topk_ids: torch.Tensor,
    pinned: torch.Tensor | None,
    mark_events: bool,
    codes: tuple[int, int],
    scan: bool = True,
    ahead: bool = False,
    dead: torch.Tensor | None = None,
) -> FusedPlan:
    """One wave of `layer` for `topk_ids` [T, K]; `codes`: the (hit, miss) event codes
    marked into `state.events` when `mark_events`; `scan`: victims in the scan-resistant
    order ("lru"), else by ascending recency ("lru-plain"); `ahead`: a prefetch's plan (hits
    not counted, `wave_end` kept: `DeviceSlotCache.plan_wave`); `dead` [T] bool: rows that
    route nothing (a padded batch's), as if their ids were -1. On CPU tensors the kernel
    runs only under Triton's interpreter (tests)."""
    from edgemoe.kernels.triton_ops.slot_plan import plan_wave_triton

    ids = topk_ids.reshape(-1).contiguous()  # the kernel indexes flat (a copy only for odd strides)
    pinned = None if pinned is None else pinned.contiguous()
    dead = None if dead is None else dead.contiguous()
    out = plan_wave_triton(*state, layer, ids, pinned, mark_events, *codes, scan, ahead, dead, topk_ids.shape[-1])
    return FusedPlan(*out)
