"""The CPU share's device side as one launch (see `kernels/share_split.py`): the same
values as the torch reference, the mailbox's used columns included. Given the bell's turn
(a decode batch, whose x rows it copies itself) it rings the bell too, once the mailbox is
written (`triton_ops/host_words.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.cpu_bell import BellTurn
from edgemoe.kernels.cpu_host_layer import MailboxBuffers
from edgemoe.kernels.row_gather import gather_rows_into
from edgemoe.kernels.share_state import DECODE, FRACTION_SHIFT, HEAT_SHIFT, NOT_MISSED, PROMPT, ShareState
from edgemoe.kernels.triton_ops.common import interpreting, pdl_start
from edgemoe.kernels.triton_ops.host_words import publish

HIST = 1024  # pairs counted into the experts' histogram at once
CHUNK_N = 1024  # pairs written to the mailbox at once (a prompt chunk's in several)
X_IN_KERNEL = 64  # token rows the launch copies itself (one program: a decode batch's)
BLOCK_H = 1024  # columns a row copy moves at once


@triton.jit
def _routed_ids(ids_ptr, dead_ptr, n, N, K, HAS_DEAD: tl.constexpr):
    """Pairs n's expert ids, -1 past N and on the dead rows (padding)."""
    idn = tl.load(ids_ptr + n, mask=n < N, other=-1)
    if HAS_DEAD:
        idn = tl.where(tl.load(dead_ptr + n // K, mask=n < N, other=0) != 0, -1, idn)
    return idn


@triton.jit
def _coldest_pick(miss, counted, heat, e, E, quota_ptr, fraction_ptr, BIG: tl.constexpr, FSHIFT: tl.constexpr,
                  BLOCK_E: tl.constexpr):
    """[BLOCK_E] int32, 1 for the decode pick among `miss`: the coldest by `heat` (ties to the
    higher id), one at a time, as many as share_split.decode_take allows of `counted`'s number."""
    key = tl.where(miss, heat * E + (E - 1 - e), BIG)  # distinct for misses
    misses = tl.sum(counted.to(tl.int64), axis=0)
    take = tl.minimum(tl.load(quota_ptr), (tl.load(fraction_ptr) * misses + (1 << (FSHIFT - 1))) >> FSHIFT)
    on_cpu = tl.zeros([BLOCK_E], tl.int32)
    for _ in range(0, take):
        m = tl.min(key, axis=0)
        pick = (key == m) & (m != BIG)
        on_cpu = tl.where(pick, 1, on_cpu)
        key = tl.where(pick, BIG, key)
    return on_cpu


@triton.jit
def _drop_picks(ids_ptr, resident_ptr, heat_ptr, quota_ptr, fraction_ptr, out_ptr, scratch_ptr, N, E,
                BIG: tl.constexpr, FSHIFT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
                USE_PDL: tl.constexpr):
    """The decode pick's pairs dropped from a routing (`share_split.drop_cpu_picks`), heat untouched."""
    e = tl.arange(0, BLOCK_E)
    ok_e = e < E
    n = tl.arange(0, BLOCK_N)
    ok_n = n < N
    pdl_start(USE_PDL)
    idn = tl.load(ids_ptr + n, mask=ok_n, other=-1).to(tl.int32)
    routed = tl.histogram(idn, BLOCK_E, mask=idn >= 0)
    miss = (routed > 0) & (tl.load(resident_ptr + e, mask=ok_e, other=0) < 0) & ok_e
    on_cpu = _coldest_pick(miss, miss, tl.load(heat_ptr + e, mask=ok_e, other=0), e, E, quota_ptr, fraction_ptr,
                           BIG, FSHIFT, BLOCK_E)
    tl.store(scratch_ptr + e, on_cpu, mask=ok_e)
    tl.debug_barrier()  # every thread's stores before any reads them back by expert
    live = ok_n & (idn >= 0)
    cpu = live & (tl.load(scratch_ptr + tl.where(live, idn, 0), mask=live, other=0) != 0)
    tl.store(out_ptr + n, tl.where(cpu, -1, idn), mask=ok_n)


def drop_picks_triton(ids: torch.Tensor, resident: torch.Tensor, heat: torch.Tensor, quota: torch.Tensor,
                      fraction: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """One launch: `share_split.drop_cpu_picks`'s values; `scratch` [E] int32 (overwritten)."""
    E, N = heat.numel(), ids.numel()
    assert ids.is_contiguous() and resident.is_contiguous() and heat.is_contiguous() and scratch.numel() >= E
    out = torch.empty_like(ids)
    pdl = pdl_enabled(ids.device)
    _drop_picks[(1,)](ids, resident, heat, quota, fraction, out, scratch, N, E, BIG=NOT_MISSED, FSHIFT=FRACTION_SHIFT,
                      BLOCK_E=triton.next_power_of_2(E), BLOCK_N=triton.next_power_of_2(N), USE_PDL=pdl,
                      launch_pdl=pdl)
    return out


@triton.jit
def _share_begin(ids_ptr, w_ptr, x_ptr, resident_ptr, heat_ptr, quota_ptr, fraction_ptr, unit_ptr, count_ptr,
                 rates_ptr, out_ids_ptr, pairs_ptr, mb_w_ptr, mb_count_ptr, mb_x_ptr, col_ptr, scratch_ptr,
                 dead_ptr, ring_ptr, done_ptr, prefetched_ptr, ring_value, N, K, T, H, E, cap, stride_x, stride_mbx,
                 BIG: tl.constexpr, SHIFT: tl.constexpr, FSHIFT: tl.constexpr, RULE: tl.constexpr,
                 CHUNK_N: tl.constexpr, BLOCK_E: tl.constexpr, HIST: tl.constexpr, BLOCK_H: tl.constexpr,
                 COPY_X: tl.constexpr, HAS_DEAD: tl.constexpr, RING: tl.constexpr, HAS_PREFETCHED: tl.constexpr,
                 INTERP: tl.constexpr, USE_PDL: tl.constexpr):
    e = tl.arange(0, BLOCK_E)
    ok_e = e < E
    pdl_start(USE_PDL)
    if RING:  # the layer's last answer cleared before its ring (published after this store)
        tl.store(done_ptr, 0)
    routed = tl.zeros([BLOCK_E], tl.int64)  # pairs routing each expert
    for n0 in range(0, N, HIST):
        nc = n0 + tl.arange(0, HIST)
        idc = _routed_ids(ids_ptr, dead_ptr, nc, N, K, HAS_DEAD).to(tl.int32)
        routed += tl.histogram(idc, BLOCK_E, mask=idc >= 0).to(tl.int64)
    resident = tl.load(resident_ptr + e, mask=ok_e, other=0)
    miss = (routed > 0) & (resident < 0) & ok_e
    on_cpu = tl.zeros([BLOCK_E], tl.int32)
    if RULE == 0:  # decode: the coldest misses (share_split.decode_take's count); then heat
        heat = tl.load(heat_ptr + e, mask=ok_e, other=0)
        counted = miss
        if HAS_PREFETCHED:  # the prefetch's copies were misses when it left the pick's share to the CPU
            counted = miss | ((routed > 0) & (tl.load(prefetched_ptr + e, mask=ok_e, other=0) != 0))
        on_cpu = _coldest_pick(miss, counted, heat, e, E, quota_ptr, fraction_ptr, BIG, FSHIFT, BLOCK_E)
        tl.store(heat_ptr + e, heat - (heat >> SHIFT) + routed * tl.load(unit_ptr), mask=ok_e)
        ncpu = tl.sum(on_cpu, axis=0)
        tl.store(scratch_ptr + e, on_cpu, mask=ok_e)
    else:  # prompt: fewest tokens first while the CPU's time stays within the device's for the rest
        # One sort and prefix sums (the reference's form), not a pick a miss: a chunk's layer
        # has ~100 misses, and a reduction a pick cost 120-170 µs a layer (2026-12-04).
        # the misses first, by their tokens, ties to the higher id
        key = tl.sort(tl.where(miss, routed * E + (E - 1 - e), BIG))
        missed = key != BIG
        tokens = tl.where(missed, key // E, 0)  # each sorted miss's tokens
        misses = tl.sum(missed.to(tl.int64), axis=0)
        experts = tl.sum(((routed > 0) & ok_e).to(tl.int64), axis=0)  # the chunk's routed experts
        fixed, per_token = tl.load(rates_ptr), tl.load(rates_ptr + 1)
        copy_ns, gemm_ns = tl.load(rates_ptr + 2), tl.load(rates_ptr + 3)
        cpu_ns = tl.cumsum(tl.where(missed, fixed + per_token * tokens, 0), axis=0)  # the first k misses' CPU time
        k = e.to(tl.int64) + 1
        device_ns = (misses - k) * copy_ns + (experts - k) * gemm_ns  # what the device has left
        fits = missed & (cpu_ns <= device_ns) & (tl.cumsum(tokens, axis=0) <= cap - 1)
        taken = tl.cumsum((~fits).to(tl.int32), axis=0) == 0  # the leading run: both sums only grow
        ncpu = tl.sum(taken.to(tl.int32), axis=0)
        tl.store(scratch_ptr + e, on_cpu, mask=ok_e)
        tl.debug_barrier()  # the zeros before the picks' ones (other threads may hold them)
        tl.store(scratch_ptr + tl.where(taken, E - 1 - key % E, 0), tl.full([BLOCK_E], 1, tl.int32), mask=taken)
    tl.store(count_ptr, tl.load(count_ptr) + ncpu.to(tl.int64))
    tl.debug_barrier()  # every thread's scratch stores before any reads them back by expert
    count = ncpu * 0  # CPU pairs written so far (the next mailbox column)
    for n0 in range(0, N, CHUNK_N):
        n = n0 + tl.arange(0, CHUNK_N)
        ok_n = n < N
        idn = _routed_ids(ids_ptr, dead_ptr, n, N, K, HAS_DEAD)
        live = ok_n & (idn >= 0)
        cpu_pair = live & (tl.load(scratch_ptr + tl.where(live, idn, 0), mask=live, other=0) != 0)
        at = count + tl.cumsum(cpu_pair.to(tl.int32), axis=0) - 1
        tl.store(out_ids_ptr + n, tl.where(cpu_pair, -1, idn), mask=ok_n)
        tl.store(pairs_ptr + at, n // K, mask=cpu_pair)
        tl.store(pairs_ptr + cap + at, idn, mask=cpu_pair)
        tl.store(pairs_ptr + 2 * cap + at, n, mask=cpu_pair)
        tl.store(mb_w_ptr + at, tl.load(w_ptr + n, mask=ok_n, other=0.0).to(tl.float32), mask=cpu_pair)
        tl.store(col_ptr + n, tl.where(cpu_pair, at, -1), mask=ok_n)
        count += tl.sum(cpu_pair.to(tl.int32), axis=0)
    tl.store(mb_count_ptr, count)
    if COPY_X:
        if count > 0:  # the host function reads x only for its pairs
            for t in range(0, T):
                for h0 in range(0, H, BLOCK_H):
                    h = h0 + tl.arange(0, BLOCK_H)
                    v = tl.load(x_ptr + t * stride_x + h, mask=h < H)
                    tl.store(mb_x_ptr + t * stride_mbx + h, v, mask=h < H)
    if RING:  # the mailbox is written: the CPU may run it
        publish(ring_ptr, ring_value, INTERP)


def copies_x_itself(x: torch.Tensor) -> bool:
    """Whether the launch copies x's rows into the mailbox itself (a decode batch's; a
    prompt chunk's take a wide gather after it): then it can ring the bell too."""
    return x.shape[0] <= X_IN_KERNEL


def share_begin_triton(ids: torch.Tensor, weights: torch.Tensor, x: torch.Tensor, st: ShareState,
                       mb: MailboxBuffers, rule: int = DECODE, dead: torch.Tensor | None = None,
                       turn: BellTurn | None = None) -> torch.Tensor:
    T, K = ids.shape
    E, N, H = st.heat.numel(), ids.numel(), x.shape[1]
    assert ids.is_contiguous() and weights.is_contiguous() and x.stride(1) == 1 and mb.x.stride(1) == 1
    assert T <= mb.x.shape[0] and (rule == PROMPT or N < mb.cap), "the step exceeds the mailbox"
    assert st.cpu_col.numel() >= N, "the step exceeds the pairs' column map"
    assert dead is None or (dead.shape == (T,) and dead.dtype == torch.bool)
    copy_x = copies_x_itself(x)
    assert turn is None or copy_x, "the bell rings from the launch only when it writes the whole mailbox"
    out = torch.empty_like(ids)
    pdl = pdl_enabled(ids.device)
    _share_begin[(1,)](
        ids, weights, x, st.resident, st.heat, st.quota, st.fraction, st.heat_unit, st.cpu_count, st.rates, out,
        mb.pairs, mb.weights, mb.count, mb.x, st.cpu_col, st.scratch, dead if dead is not None else st.scratch,
        turn.ring if turn is not None else st.scratch, turn.done if turn is not None else st.scratch,
        st.prefetched if st.prefetched is not None else st.scratch,
        turn.value if turn is not None else 0, N, K, T, H, E, mb.cap, x.stride(0), mb.x.stride(0),
        BIG=NOT_MISSED, SHIFT=HEAT_SHIFT, FSHIFT=FRACTION_SHIFT, RULE=rule,
        CHUNK_N=min(CHUNK_N, triton.next_power_of_2(N)),
        BLOCK_E=triton.next_power_of_2(E), HIST=min(HIST, triton.next_power_of_2(N)),
        BLOCK_H=min(BLOCK_H, triton.next_power_of_2(H)),
        COPY_X=copy_x, HAS_DEAD=dead is not None, RING=turn is not None, HAS_PREFETCHED=st.prefetched is not None,
        INTERP=interpreting(ids),
        USE_PDL=pdl, launch_pdl=pdl,
    )
    if not copy_x:
        rows = torch.arange(T, device=x.device)
        # NOTE: a kernel's stores, not copy_: a device-to-device memcpy may not take a mapped host address.
        gather_rows_into(x if x.is_contiguous() else x.contiguous(), rows, mb.x, rows)
    return out
