"""One wave of the device expert cache's plan in one program (see `kernels/slot_plan.py`
for the contract; the torch plan in `moe/device_cache.py` is the reference).

One CTA does the whole wave in phases separated by barriers, because later phases read
what earlier ones wrote (the routed mask, the miss list) and several threads may hold
the same element (small blocks are replicated across threads):

1. `hits` is zeroed, then every routed pair stores 1 into it: `routed` [E] (a scatter, so
   any number of pairs costs one pass over them); the miss list is filled with -1. A pair
   of a padding row (`dead`, HAS_DEAD) reads as -1 wherever ids are read (`_load_ids`);
2. experts [E] in registers: hit / miss against the map, their ranks (cumsum);
3. slots [S] in registers: protected (routed by this layer, or pinned), the free ones
   taken in index order (cumsum), then the unprotected owned slots in the policy's order
   (SCAN: stale by ascending recency, then fresh by descending; else ascending recency),
   one `argmin` over the S keys per victim; each candidate written into the miss list;
4. loads of what the stores overwrite (the victims' owners, events; clock and counts in 2), a
   barrier, then every state update;
5. after a last barrier, each pair's slot read back from the new map.

A decode wave (≤ BLOCK_N pairs, `IN_REGISTERS`) finds its routed mask in registers (the pairs
against the experts) and, when nothing misses — most layers of a warm decode step — writes
its outputs and updates at once: no barrier and no value read back (each pair's slot is
the map's, gathered in registers). Every barrier and read-back of the phases above was a
dependent round trip to memory, and the plan ran 10–12.6 µs a layer in a graph on an H200
(2026-12-05), most of it with nothing to choose.

NOTE (cost): owners and recency are read once (2·S int64 per wave), the pinned mask and
a gather of `routed` once (≤ 2·S bytes); victims cost one block reduction over the S keys
held in registers each — proportional to the misses, each of which is an expert copy
that costs far more. Everything else is O(E + T·K).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels import slot_keys
from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops.common import pdl_start

NEVER: tl.constexpr = tl.constexpr(slot_keys.NEVER)  # the key of a slot that may not be evicted
FRESH: tl.constexpr = tl.constexpr(slot_keys.FRESH)  # a fresh slot's key is FRESH - recency
BLOCK_N = 256  # pairs per chunk of the routing scans
REGISTER_COMPARES = 32768  # pairs x experts a wave may compare in registers (`IN_REGISTERS`)


@triton.jit
def _load_ids(ids_ptr, dead_ptr, p, N, K, HAS_DEAD: tl.constexpr):
    """Pairs `p`'s experts as int32: -1 past N and, with HAS_DEAD, in a padding row's pairs
    (`dead` [T] uint8, pair p in row p // K) — the routing masked inside the plan rather
    than by a launch of its own on the decode chain."""
    x = tl.load(ids_ptr + p, mask=p < N, other=-1).to(tl.int32)
    if HAS_DEAD:
        x = tl.where(tl.load(dead_ptr + p // K, mask=p < N, other=0) != 0, -1, x)
    return x


@triton.jit
def _no_misses(misses_ptr, M, BLOCK_M: tl.constexpr):
    """The miss list [2, M] all -1 (experts and slots): nothing to copy."""
    m = tl.arange(0, BLOCK_M)
    tl.store(misses_ptr + m, tl.full([BLOCK_M], -1, tl.int32), mask=m < M)
    tl.store(misses_ptr + M + m, tl.full([BLOCK_M], -1, tl.int32), mask=m < M)


@triton.jit
def _routed(ids_ptr, dead_ptr, hits_ptr, misses_ptr, N, K, M, E, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, HAS_DEAD: tl.constexpr):
    """Phase 1: hits_ptr[e] = 1 for routed experts, 0 for the rest; misses [2, M] = -1."""
    e = tl.arange(0, BLOCK_E)
    tl.store(hits_ptr + e, tl.zeros([BLOCK_E], tl.uint8), mask=e < E)
    _no_misses(misses_ptr, M, BLOCK_M)
    tl.debug_barrier()  # the zeros land before any thread's ones
    for start in range(0, N, BLOCK_N):
        p = start + tl.arange(0, BLOCK_N)
        x = _load_ids(ids_ptr, dead_ptr, p, N, K, HAS_DEAD)
        tl.store(hits_ptr + x, tl.full([BLOCK_N], 1, tl.uint8), mask=x >= 0)  # duplicates write the same 1
    tl.debug_barrier()


@triton.jit
def _choose_slots(pinned_ptr, owners_ptr, recency_ptr, wave_end_ptr, hits_ptr, misses_ptr, layer, num_misses, M,
                  E, S, BLOCK_S: tl.constexpr, HAS_PINNED: tl.constexpr, SCAN: tl.constexpr):
    """Phase 3: candidate slots into the miss list's row 1; returns how many misses get one.

    Candidate order: free slots by index, then unprotected owned slots by the policy's key."""
    s = tl.arange(0, BLOCK_S)
    in_pool = s < S
    owner = tl.load(owners_ptr + s, mask=in_pool, other=-1)
    owned = owner >= 0
    key = tl.where(owned, owner, 0)
    same_layer = owned & (key // E == layer)
    routed = tl.load(hits_ptr + (key % E), mask=same_layer & in_pool, other=0, volatile=True)
    protected = (same_layer & (routed != 0)) | ~in_pool
    if HAS_PINNED:
        protected = protected | (tl.load(pinned_ptr + s, mask=in_pool, other=0) != 0)
    open_free = ~owned & ~protected
    num_free = tl.sum(open_free.to(tl.int32), axis=0)
    num_open = tl.sum((~protected).to(tl.int32), axis=0)
    num_taken = tl.minimum(num_misses, num_open)
    free_rank = tl.cumsum(open_free.to(tl.int32), axis=0) - open_free.to(tl.int32)
    tl.store(misses_ptr + M + free_rank, s, mask=open_free & (free_rank < num_taken))
    recency = tl.load(recency_ptr + s, mask=in_pool, other=0)
    if SCAN:  # stale (used before this layer's last wave ended) first, then fresh, newest first
        stale_before = tl.load(wave_end_ptr + layer)  # the old value: stored in phase 4
        recency = tl.where(recency < stale_before, recency, FRESH - recency)
    keys = tl.where(owned & ~protected, recency, NEVER)
    # NOTE: recency values of owned slots are unique (the cache's clock) and the key is
    # injective in it, so each argmin is the one best victim left, victims come out in order.
    for i in range(tl.maximum(num_taken - num_free, 0)):
        victim = tl.argmin(keys, axis=0)
        tl.store(misses_ptr + M + num_free + i, victim)
        keys = tl.where(s == victim, NEVER, keys)
    return num_taken


@triton.jit
def _pair_slots(ids_ptr, dead_ptr, map_ptr, slot_ids_ptr, layer, N, K, E, BLOCK_N: tl.constexpr,
                HAS_DEAD: tl.constexpr):
    """Phase 5: each pair's slot in the updated map (-1 for pairs not routed)."""
    for start in range(0, N, BLOCK_N):
        p = start + tl.arange(0, BLOCK_N)
        x = _load_ids(ids_ptr, dead_ptr, p, N, K, HAS_DEAD)
        slot = tl.load(map_ptr + layer * E + x, mask=x >= 0, other=-1, volatile=True)
        tl.store(slot_ids_ptr + p, slot, mask=p < N)


@triton.jit
def _routed_in_registers(ids_ptr, dead_ptr, N, K, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_DEAD: tl.constexpr):
    """Phase 1 for a wave of ≤ BLOCK_N pairs: (the pairs' experts [BLOCK_N], -1 past N or not
    routed; routed [BLOCK_E]) in registers, each expert against every pair."""
    p = tl.arange(0, BLOCK_N)
    pair = _load_ids(ids_ptr, dead_ptr, p, N, K, HAS_DEAD)
    e = tl.arange(0, BLOCK_E)
    return pair, tl.max((pair[:, None] == e[None, :]).to(tl.int32), axis=0) != 0


@triton.jit
def _all_hits(pair, hit, hit_rank, num_hits, slot_before, clock, counts, layer, N, M, E, HIT, hits_ptr,
              misses_ptr, recency_ptr, events_ptr, clock_ptr, wave_end_ptr, counts_ptr, overflow_ptr,
              slot_ids_ptr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              MARK: tl.constexpr, AHEAD: tl.constexpr):
    """A wave whose routed experts all hit, its phases 3-5 in one pass: every output and
    update stored once (copies of a value held by several threads store the same value),
    nothing read back."""
    e = tl.arange(0, BLOCK_E)
    tl.store(hits_ptr + e, hit.to(tl.uint8), mask=e < E)
    _no_misses(misses_ptr, M, BLOCK_M)
    tl.store(recency_ptr + slot_before, clock + hit_rank, mask=hit)
    if MARK:
        events = tl.load(events_ptr + layer * E + e, mask=e < E, other=0)
        tl.store(events_ptr + layer * E + e, tl.maximum(events, tl.where(hit, HIT, 0).to(tl.uint8)), mask=e < E)
    tl.store(clock_ptr, clock + num_hits)
    counted = tl.where(tl.arange(0, 2) == 0, num_hits, 0)
    if AHEAD:
        counted = counted * 0
    else:
        tl.store(wave_end_ptr + layer, clock + num_hits, mask=num_hits > 0)
    tl.store(counts_ptr + layer * 2 + tl.arange(0, 2), counts + counted)
    tl.store(overflow_ptr, tl.zeros([], tl.uint8))
    p = tl.arange(0, BLOCK_N)
    slot = tl.gather(slot_before, tl.maximum(pair, 0), axis=0)  # a hit's slot is the map's
    tl.store(slot_ids_ptr + p, tl.where(pair >= 0, slot, -1), mask=p < N)


@triton.jit(do_not_specialize=["layer", "N", "M"])
def _plan_wave(ids_ptr, dead_ptr, pinned_ptr, map_ptr, owners_ptr, recency_ptr, clock_ptr, counts_ptr, events_ptr,
               wave_end_ptr, slot_ids_ptr, hits_ptr, misses_ptr, overflow_ptr, layer, N, K, M, E, S, HIT, MISS,
               BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_PINNED: tl.constexpr, HAS_DEAD: tl.constexpr, MARK: tl.constexpr, SCAN: tl.constexpr,
               AHEAD: tl.constexpr, IN_REGISTERS: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_start(USE_PDL)
    e = tl.arange(0, BLOCK_E)
    slot_before = tl.load(map_ptr + layer * E + e, mask=e < E, other=-1)
    clock = tl.load(clock_ptr)
    counts = tl.load(counts_ptr + layer * 2 + tl.arange(0, 2))
    if IN_REGISTERS:
        pair, routed = _routed_in_registers(ids_ptr, dead_ptr, N, K, BLOCK_E, BLOCK_N, HAS_DEAD)
    else:
        _routed(ids_ptr, dead_ptr, hits_ptr, misses_ptr, N, K, M, E, BLOCK_E, BLOCK_M, BLOCK_N, HAS_DEAD)
        routed = tl.load(hits_ptr + e, mask=e < E, other=0, volatile=True) != 0
        pair = tl.full([BLOCK_N], -1, tl.int32)  # unused: the miss path reads the pairs back
    # Phase 2: the experts, and every scalar the last phase overwrites (loaded before a barrier).
    hit, miss = routed & (slot_before >= 0), routed & (slot_before < 0)
    hit_rank = tl.cumsum(hit.to(tl.int32), axis=0) - hit.to(tl.int32)
    num_hits, num_misses = tl.sum(hit.to(tl.int32), axis=0), tl.sum(miss.to(tl.int32), axis=0)
    if IN_REGISTERS and num_misses == 0:
        _all_hits(pair, hit, hit_rank, num_hits, slot_before, clock, counts, layer, N, M, E, HIT, hits_ptr,
                  misses_ptr, recency_ptr, events_ptr, clock_ptr, wave_end_ptr, counts_ptr, overflow_ptr,
                  slot_ids_ptr, BLOCK_E, BLOCK_M, BLOCK_N, MARK, AHEAD)
    else:
        if IN_REGISTERS:  # what the miss path reads back: the routed mask, a -1 filled miss list
            tl.store(hits_ptr + e, routed.to(tl.uint8), mask=e < E)
            _no_misses(misses_ptr, M, BLOCK_M)
            tl.debug_barrier()
        _with_misses(ids_ptr, dead_ptr, pinned_ptr, map_ptr, owners_ptr, recency_ptr, clock_ptr, counts_ptr,
                     events_ptr, wave_end_ptr, slot_ids_ptr, hits_ptr, misses_ptr, overflow_ptr, layer, N, K, M, E, S,
                     HIT, MISS, hit, miss, hit_rank, num_hits, num_misses, slot_before, clock, counts, BLOCK_E,
                     BLOCK_S, BLOCK_M, BLOCK_N, HAS_PINNED, HAS_DEAD, MARK, SCAN, AHEAD)


@triton.jit
def _with_misses(ids_ptr, dead_ptr, pinned_ptr, map_ptr, owners_ptr, recency_ptr, clock_ptr, counts_ptr, events_ptr,
                 wave_end_ptr, slot_ids_ptr, hits_ptr, misses_ptr, overflow_ptr, layer, N, K, M, E, S, HIT, MISS,
                 hit, miss, hit_rank, num_hits, num_misses, slot_before, clock, counts, BLOCK_E: tl.constexpr,
                 BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_PINNED: tl.constexpr,
                 HAS_DEAD: tl.constexpr, MARK: tl.constexpr, SCAN: tl.constexpr, AHEAD: tl.constexpr):
    """Phases 3-5 of a wave that may miss: slots chosen, state updated, pairs' slots read back."""
    e = tl.arange(0, BLOCK_E)
    miss_rank = tl.cumsum(miss.to(tl.int32), axis=0) - miss.to(tl.int32)
    # A wave without misses (most layers of a warm decode step) chooses no slot: skip the
    # pool scan (two [S] loads, a gather and three block reductions) — it would take none.
    num_taken = num_misses * 0
    if num_misses > 0:
        num_taken = _choose_slots(pinned_ptr, owners_ptr, recency_ptr, wave_end_ptr, hits_ptr, misses_ptr, layer,
                                  num_misses, M, E, S, BLOCK_S, HAS_PINNED, SCAN)
    take = miss & (miss_rank < num_taken)
    tl.store(misses_ptr + miss_rank, e, mask=take)  # row 0: the misses given a slot, in routed order
    tl.debug_barrier()
    # Phase 4: loads of what the updates overwrite, a barrier, the updates.
    j = tl.arange(0, BLOCK_M)
    taken = j < num_taken
    expert = tl.load(misses_ptr + j, mask=taken, other=0, volatile=True)
    slot = tl.load(misses_ptr + M + j, mask=taken, other=0, volatile=True)
    evicted = tl.load(owners_ptr + slot, mask=taken, other=-1)  # key losing its slot, -1: it was free
    if MARK:
        code = tl.where(hit, HIT, tl.where(take, MISS, 0)).to(tl.uint8)
        events = tl.maximum(tl.load(events_ptr + layer * E + e, mask=e < E, other=0), code)
    tl.debug_barrier()
    tl.store(hits_ptr + e, hit.to(tl.uint8), mask=e < E)
    tl.store(recency_ptr + slot_before, clock + hit_rank, mask=hit)
    if MARK:
        tl.store(events_ptr + layer * E + e, events, mask=e < E)
    key = layer.to(tl.int64) * E + expert
    tl.store(map_ptr + evicted, tl.full([BLOCK_M], -1, tl.int32), mask=taken & (evicted >= 0))
    tl.store(map_ptr + key, slot, mask=taken)
    tl.store(owners_ptr + slot, key, mask=taken)
    tl.store(recency_ptr + slot, clock + num_hits + j, mask=taken)
    tl.store(clock_ptr, clock + num_hits + num_taken)
    counted = tl.where(tl.arange(0, 2) == 0, num_hits, num_taken)
    if AHEAD:  # a prefetch's plan: its hits are no use yet, and the layer's cycle stays
        counted = tl.where(tl.arange(0, 2) == 0, 0, num_taken)
    else:  # a wave that routed nothing (padding, a static trailing wave) is no wave of the layer's cycle
        tl.store(wave_end_ptr + layer, clock + num_hits + num_taken, mask=num_hits + num_misses > 0)
    tl.store(counts_ptr + layer * 2 + tl.arange(0, 2), counts + counted)
    tl.store(overflow_ptr, (num_misses > num_taken).to(tl.uint8))
    tl.debug_barrier()
    _pair_slots(ids_ptr, dead_ptr, map_ptr, slot_ids_ptr, layer, N, K, E, BLOCK_N, HAS_DEAD)


def num_warps_for(block_s: int) -> int:
    """Warps for a pool block: 16 int64 keys per thread up to 8192 slots (ptxas: ≤ 48 bytes
    spilled on sm_86), 32 at 16384 (some spills: still one pass)."""
    return max(4, min(16, block_s // 512))


def plan_wave_triton(
    slot_map: torch.Tensor,
    owners: torch.Tensor,
    recency: torch.Tensor,
    clock: torch.Tensor,
    counts: torch.Tensor,
    events: torch.Tensor,
    wave_end: torch.Tensor,
    layer: int,
    ids: torch.Tensor,
    pinned: torch.Tensor | None,
    mark_events: bool,
    hit_code: int,
    miss_code: int,
    scan: bool,
    ahead: bool = False,
    dead: torch.Tensor | None = None,
    k: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(slot_ids [N] int32, hits [E] bool, misses [2, M] int32, overflow [] bool); state in
    place. `dead` [N / k] bool: rows whose `k` pairs route nothing (padding)."""
    S, E, N = owners.numel(), slot_map.shape[1], ids.numel()
    assert dead is None or (dead.is_contiguous() and dead.numel() * k == N)
    M = min(N, E, S)
    for t in (slot_map, owners, recency, counts, events, wave_end, ids):
        assert t.is_contiguous(), "the plan kernel indexes flat, contiguous tensors"
    device = ids.device
    slot_ids = torch.empty(N, dtype=torch.int32, device=device)
    hits = torch.empty(E, dtype=torch.uint8, device=device)
    misses = torch.empty((2, M), dtype=torch.int32, device=device)
    overflow = torch.empty((), dtype=torch.uint8, device=device)
    block_s = triton.next_power_of_2(S)
    block_e = triton.next_power_of_2(E)
    # a decode wave's pairs against the experts in registers: [pairs, E] compares, kept small
    in_registers = N <= BLOCK_N and max(16, triton.next_power_of_2(N)) * block_e <= REGISTER_COMPARES
    pdl = pdl_enabled(device)
    _plan_wave[(1,)](
        ids, ids if dead is None else dead.view(torch.uint8), owners if pinned is None else pinned, slot_map, owners, recency, clock, counts, events, wave_end,
        slot_ids, hits, misses, overflow, layer, N, k, M, E, S, hit_code, miss_code,
        BLOCK_E=block_e, BLOCK_S=block_s, BLOCK_M=triton.next_power_of_2(min(E, S)),
        BLOCK_N=max(16, triton.next_power_of_2(N)) if in_registers else BLOCK_N, HAS_PINNED=pinned is not None,
        HAS_DEAD=dead is not None, MARK=mark_events, SCAN=scan, AHEAD=ahead, IN_REGISTERS=in_registers, USE_PDL=pdl,
        launch_pdl=pdl, num_warps=num_warps_for(block_s),
    )
    return slot_ids, hits.view(torch.bool), misses, overflow.view(torch.bool)
