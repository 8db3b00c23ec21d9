"""The device cache's CPU share, its device side per MoE layer (`moe/cpu_share.py` says what
and why): `share_begin` picks the CPU's experts, writes the mailbox and each pair's
mailbox column, by which the layer's combine reads the CPU's cells once the host function
is done (`kernels/cell_sources.py`).

The torch functions are the reference and the CPU path (~30 small ops a layer: 60–90 µs
of a replayed decode graph on an H200, measured as quota 0's cost against plain offload);
on CUDA each is one Triton launch (`triton_ops/share_split.py`), the same values.
Capturable either way: fixed shapes, no host read.

`ShareState` (`kernels/share_state.py`, with the pick's constants: the contract this module
and the Triton kernels share): what persists across steps (`heat`, `cpu_count` are one
layer's rows);
`MailboxBuffers` (`kernels/cpu_host_layer.py`) the host function's inputs and outputs,
device-visible (mapped views on a GPU).
"""

from __future__ import annotations

import torch

from edgemoe.kernels.backend import triton_importable
from edgemoe.kernels.cpu_bell import BellTurn
from edgemoe.kernels.cpu_host_layer import MailboxBuffers
from edgemoe.kernels.row_gather import gather_rows_into
from edgemoe.kernels.slot_plan import present
from edgemoe.kernels.share_state import (
    DECODE,
    FRACTION_ONE,
    FRACTION_SHIFT,
    HEAT_SHIFT,
    NOT_MISSED,
    ShareState,
)

def decode_take(misses: int, quota: int, fraction: int) -> int:
    """How many of a layer's `misses` the decode pick gives the CPU: at most `quota`, and
    `fraction` (≤ FRACTION_ONE) sixteenths of them rounded half up (integers: the kernels'
    arithmetic; `coldest_of` is its device form)."""
    return min(quota, (fraction * misses + FRACTION_ONE // 2) >> FRACTION_SHIFT)


def coldest_of(miss: torch.Tensor, heat: torch.Tensor, quota: torch.Tensor | int,
               fraction: torch.Tensor | int, counted: torch.Tensor | None = None) -> torch.Tensor:
    """[E] bool: the decode pick among `miss` [E] bool — the coldest by `heat` [E] (ties to
    the higher id), as many as `decode_take` allows of the misses, or of `counted` [E] bool
    (the misses and more) where given. Device work only (capturable)."""
    E = miss.numel()
    counted = miss if counted is None else counted
    key = torch.where(miss, heat * E + torch.arange(E - 1, -1, -1, device=miss.device), NOT_MISSED)
    # A miss's rank: the keys below its own (distinct among misses; the rest sort last). One
    # [E, E] comparison instead of a sort and a scatter on the decode step's chain.
    rank = (key[None, :] < key[:, None]).sum(1)
    take = torch.minimum(torch.as_tensor(quota), (fraction * counted.sum() + FRACTION_ONE // 2) >> FRACTION_SHIFT)
    return miss & (rank < take)


def _fused(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_importable()


def drop_cpu_picks(ids: torch.Tensor, resident: torch.Tensor, heat: torch.Tensor, quota: torch.Tensor,
                   fraction: torch.Tensor | int = FRACTION_ONE, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """ids [T, K] without the pairs of the decode pick's misses against `resident` [E]
    (-1: not), the heat left as it is (the decode prefetch leaves them to the share). On CUDA
    with `scratch` ([E] int32, overwritten) and a tensor `fraction`: one launch; else the
    reference's ~20 small ops."""
    if scratch is not None and isinstance(fraction, torch.Tensor) and _fused(ids):
        from edgemoe.kernels.triton_ops.share_split import drop_picks_triton

        return drop_picks_triton(ids.contiguous(), resident, heat, quota, fraction, scratch)
    return drop_cpu_picks_ref(ids, resident, heat, quota, fraction)


def drop_cpu_picks_ref(ids: torch.Tensor, resident: torch.Tensor, heat: torch.Tensor, quota: torch.Tensor,
                       fraction: torch.Tensor | int = FRACTION_ONE) -> torch.Tensor:
    """`drop_cpu_picks` in torch (the reference and the CPU path): `coldest_of` the misses."""
    E = heat.numel()
    flat = ids.reshape(-1).long()
    cpu = coldest_of(present(ids, E) & (resident < 0), heat, quota, fraction)
    cpu = torch.cat((cpu, torch.zeros(1, dtype=torch.bool, device=ids.device)))
    return torch.where(cpu[torch.where(flat >= 0, flat, E)].view(ids.shape), -1, ids)


def rings_itself(ids: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether `share_begin` can ring the CPU share's bell from its own launch (a `turn`):
    the Triton launch of a decode batch, which writes the whole mailbox itself."""
    if not _fused(ids):
        return False
    from edgemoe.kernels.triton_ops.share_split import copies_x_itself

    return copies_x_itself(x)


def share_begin(ids: torch.Tensor, weights: torch.Tensor, x: torch.Tensor, st: ShareState,
                mb: MailboxBuffers, rule: int = DECODE, dead: torch.Tensor | None = None,
                turn: BellTurn | None = None) -> torch.Tensor:
    """Pick the CPU's experts of a layer, write the mailbox (the CPU pairs in pair order:
    token row, expert, pair index, weight; their count; x's rows when any) and `cpu_col`.
    ids [T, K] (-1: not routed), weights [T, K], x [T, H]; `dead` [T] bool or None: rows
    whose pairs count as not routed (a padded batch's padding, masked here rather than by
    a launch of its own). Returns the device's routing: ids with the CPU's pairs and the
    dead rows' -1. The pick (`rule`):
    - DECODE: the coldest misses (lowest heat, ties to the higher id), as many as
      `decode_take` allows (the quota, the fraction of the layer's misses); then the
      layer's routed experts are heated;
    - PROMPT: the misses with the fewest tokens (ties to the higher id), as many as keep
      the CPU's predicted time (`rates`: fixed + per token, each) within the device's
      for the rest (the other misses' copies, and every routed expert's GEMMs but the
      CPU's), and their pairs within the mailbox; heat untouched.
    `turn` (only where `rings_itself`): the bell's, rung once the mailbox is written."""
    if _fused(ids):
        from edgemoe.kernels.triton_ops.share_split import share_begin_triton

        return share_begin_triton(ids, weights, x, st, mb, rule, dead, turn)
    assert turn is None, "the torch path rings the bell on the stream"
    return share_begin_ref(ids, weights, x, st, mb, rule, dead)


def _routed_misses(ids: torch.Tensor, st: ShareState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([E] pairs routing each expert, [E] bool routed and not resident, [E] the tie-break
    key part: a higher id sorts first)."""
    flat = ids.reshape(-1).long()
    E = st.heat.numel()
    routed = torch.zeros(E, dtype=torch.int64, device=flat.device).index_add_(0, flat.clamp(min=0), (flat >= 0).long())
    return routed, (routed > 0) & (st.resident < 0), torch.arange(E - 1, -1, -1, device=flat.device)


def coldest_misses_ref(ids: torch.Tensor, st: ShareState) -> torch.Tensor:
    """[E] bool: the CPU's experts; heats the routed experts (the reference)."""
    routed, miss, _ = _routed_misses(ids, st)
    counted = None if st.prefetched is None else miss | ((routed > 0) & st.prefetched)
    on_cpu = coldest_of(miss, st.heat, st.quota, st.fraction, counted)
    st.heat.sub_(st.heat >> HEAT_SHIFT).add_(routed * st.heat_unit)
    return on_cpu


def balanced_misses_ref(ids: torch.Tensor, st: ShareState, max_pairs: int) -> torch.Tensor:
    """[E] bool: the prompt rule's CPU experts (the reference). Integer ns: the same sums
    in any order of addition."""
    routed, miss, tiebreak = _routed_misses(ids, st)
    E = miss.numel()
    key = torch.where(miss, routed * E + tiebreak, NOT_MISSED)
    order = torch.argsort(key)  # keys are distinct where it matters (misses first)
    tokens = routed[order]
    fixed, per_token, copy_ns, gemm_ns = st.rates[0], st.rates[1], st.rates[2], st.rates[3]
    cpu_ns = torch.cumsum(fixed + per_token * tokens, 0)  # the first k misses' CPU time, k = 1..E
    k = torch.arange(1, E + 1, device=ids.device)
    device_ns = (miss.sum() - k) * copy_ns + ((routed > 0).sum() - k) * gemm_ns  # what the device has left
    fits = miss[order] & (cpu_ns <= device_ns) & (torch.cumsum(tokens, 0) <= max_pairs)
    taken = torch.cumprod(fits.long(), 0).bool()  # the leading run: both sums only grow
    return torch.zeros(E, dtype=torch.bool, device=ids.device).scatter_(0, order, taken)


def share_begin_ref(ids: torch.Tensor, weights: torch.Tensor, x: torch.Tensor, st: ShareState,
                    mb: MailboxBuffers, rule: int = DECODE, dead: torch.Tensor | None = None) -> torch.Tensor:
    if dead is not None:
        ids = ids.masked_fill(dead[:, None], -1)
    on_cpu = coldest_misses_ref(ids, st) if rule == DECODE else balanced_misses_ref(ids, st, mb.cap - 1)
    st.cpu_count.add_(on_cpu.sum())
    flat = ids.reshape(-1).long()
    live = flat >= 0
    cpu_pair = live & on_cpu[flat.clamp(min=0)]  # [N]
    top_k, N, cap = ids.shape[1], flat.numel(), mb.cap
    pair = torch.arange(N, device=flat.device)
    at = torch.where(cpu_pair, cpu_pair.long().cumsum(0) - 1, cap - 1)  # [N] mailbox column (cap - 1: trash)
    mb.pairs.index_copy_(1, at, torch.stack((pair // top_k, flat, pair)).to(torch.int32))
    mb.weights.index_copy_(0, at, weights.reshape(-1).float())
    mb.count.copy_(cpu_pair.sum().view(1))
    rows = torch.arange(x.shape[0], device=x.device)
    # NOTE: a kernel's stores, not copy_: a device-to-device memcpy may not take a mapped host address.
    gather_rows_into(x if x.is_contiguous() else x.contiguous(), rows, mb.x, rows)
    st.cpu_col[:N].copy_(torch.where(cpu_pair, at, -1))
    return ids.masked_fill(cpu_pair.view(ids.shape), -1)
