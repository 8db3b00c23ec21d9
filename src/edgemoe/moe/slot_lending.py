"""The slot pool's tail lent to a streamed prompt chunk's activations (issue 13: one memory
plan serves decode and prefill).

A chunk of `stream_min_tokens` prompt tokens or more streams every MoE layer's experts
through a double buffer (`moe/prefill_stream.py`) and plans no waves: while it runs, the
cache needs only the slots it holds below the tail and the double buffer. So the memory
plan (engine/budget.py) reserves the workspace of the largest step that doesn't stream and
sizes a tail of the pool to cover the rest of the largest chunk's. Before a streamed
step the tail's slots are emptied (`DeviceSlotCache.evict_from`) and their memory handed
to the driver (`SlotBanks.release_tail`), where torch's allocator finds it for the chunk's
activations (its limit raised by as much); before the next step that doesn't stream,
torch's cached blocks are released, its limit lowered, and the tail mapped again at the
same addresses, so the decode graphs captured over the banks stay valid. The chunks of one
long prompt keep the loan from the first to the last.

Each switch waits for the device (the tail's last readers before the loan; the chunk's
activations before the return): twice per long prompt, not per step. The tail's experts
are gone after a loan: the decode steps that follow copy them again as misses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from edgemoe.env_switch import env_switch
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.offload import SlotBanks

log = logging.getLogger(__name__)

LEND_ENV = "EDGEMOE_LEND_SLOTS"  # "0": chunks never borrow (the A/B, and runs measured before lending)


def lend_tokens() -> int:
    """The prompt chunks that borrow the pool's tail where the device cache streams them: the
    streaming threshold (`EDGEMOE_PREFILL_STREAM_TOKENS`), 0 with `EDGEMOE_LEND_SLOTS=0`."""
    from edgemoe.moe.prefill_stream import stream_min_tokens

    return stream_min_tokens() if env_switch(LEND_ENV, True) else 0


class SlotLending:
    """Lends the last `tail_slots` of `cache`'s pool (their memory in `banks`) while steps of
    `min_tokens` prompt rows or more run. `set_limit(held)`: sets torch's allocator limit
    given the bytes the banks hold outside it (None: no limit to keep); `before_return`
    drops the tensors the loan's steps kept (the chunks' own cell buffer)."""

    def __init__(self, cache: DeviceSlotCache, banks: SlotBanks, tail_slots: int, min_tokens: int,
                 before_return: Callable[[], None] = lambda: None) -> None:
        if not 0 < tail_slots < cache.num_slots:
            raise ValueError(f"cannot lend {tail_slots} of {cache.num_slots} slots")
        self.cache, self.banks, self.tail_slots, self.min_tokens = cache, banks, tail_slots, min_tokens
        self.first = cache.num_slots - tail_slots  # the first lent slot
        self.lent = False
        self.loans = 0  # loans made (the executor's statistics)
        self.set_limit: Callable[[int], None] | None = None
        self.before_return = before_return  # drops what the loan's steps kept in the lent memory

    def attach_limit(self, set_limit: Callable[[int], None]) -> None:
        """Keep torch's allocator limit with the banks' memory (it doesn't count them)."""
        self.set_limit = set_limit
        set_limit(self.banks.outside_allocator)

    def before_step(self, prompt_rows: int) -> None:
        """Lend the tail before a step that streams, take it back before one that doesn't."""
        streams = 0 < self.min_tokens <= prompt_rows
        if streams and not self.lent:
            self.lend()
        elif not streams and self.lent:
            self.take_back()

    def lend(self) -> None:
        device = self.cache.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the tail's last readers (the step before, overlapped)
        self.cache.evict_from(self.first)
        self.banks.release_tail()
        self.lent, self.loans = True, self.loans + 1
        if self.set_limit is not None:
            self.set_limit(self.banks.outside_allocator)

    def take_back(self) -> None:
        device, cuda = self.cache.device, self.cache.device.type == "cuda"
        self.before_return()
        if cuda:
            torch.cuda.synchronize(device)  # the chunk's activations are dead once its work is done
        if self.set_limit is not None:  # what the banks will hold again, before torch's cache shrinks
            self.set_limit(self.banks.outside_allocator + self.banks.tail_bytes)
        if cuda:
            torch.cuda.empty_cache()  # the blocks torch cached in the tail's memory
        self.banks.map_tail()
        self.lent = False


def make_lending(cache: DeviceSlotCache, banks: SlotBanks, lend_slots: int, min_tokens: int, num_experts: int,
                 drop_loaned: Callable[[], None]) -> SlotLending | None:
    """The tail of `lend_slots` slots lent to streamed chunks, if it can be (the plan asked,
    the banks' memory can be lent, the chunks stream); `drop_loaned`: the executor's hook
    that lets go of the cells it took from a loan."""
    if not lend_slots:
        return None
    if not banks.tail_bytes or not min_tokens or cache.num_slots - lend_slots < 2 * num_experts:
        log.warning("the memory plan lends %d slots to long prompt chunks, but they can't be lent here "
                    "(no virtual memory management, or no streamed chunks): such a chunk may exceed "
                    "--gpu-memory", lend_slots)
        return None
    return SlotLending(cache, banks, lend_slots, min_tokens, drop_loaned)
