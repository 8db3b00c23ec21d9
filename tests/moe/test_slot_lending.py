"""The slot pool's tail lent to streamed chunks (moe/slot_lending.py) on CPU, where the
banks' memory itself can't be lent (a plain tensor: tests/gpu/test_slot_lending_gpu.py
lends it on a GPU) but every decision around it runs: the tail's slots emptied before a
streamed step and never given to its double buffer, the loan kept across the chunks of
one prompt and returned before the next step that doesn't stream, outputs bitwise the
resident executor's throughout, torch's allocator limit moved by the lent bytes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.registry import make_executor
from edgemoe.moe.slot_lending import SlotLending
from edgemoe.moe.store import BankStore
from edgemoe.testing.moe_material import random_bank_store

L, E, K, H, I = 3, 8, 2, 16, 12
CPU = torch.device("cpu")
STREAM, TAIL = 6, 5  # chunks of 6 prompt rows or more stream; the last 5 slots are lent to them
SLOTS = 2 * E + TAIL + 3


@pytest.fixture(scope="module")
def store() -> BankStore:
    return random_bank_store(L, E, H, I, seed=4)


def _lending_executor(store: BankStore) -> DeviceOffloadExecutor:
    ex = make_executor("offload", store, CPU, F.silu, L, SLOTS, expert_cache="device", stream_tokens=STREAM)
    assert isinstance(ex, DeviceOffloadExecutor) and ex.lending is None  # no plan asked for a loan
    ex.lending = SlotLending(ex.cache, ex.slots, TAIL, STREAM)  # as lend_slots=TAIL would on a GPU
    ex.streaming.below = ex.lending.first
    return ex


def _run(ex, resident, g: torch.Generator, T: int, num_decode: int = 0, hook: bool = True) -> None:  # noqa: ANN001
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    if hook:
        ex.before_step(0.0, None if T > num_decode else T, T - num_decode)
    for layer in range(L):
        got = ex.forward(layer, x, ids, w, num_decode=num_decode)
        assert torch.equal(got, resident.forward(layer, x, ids, w, num_decode=num_decode)), (T, layer)


def test_evict_from_empties_the_tail_and_lend_stays_below() -> None:
    cache = DeviceSlotCache(12, 2, 8, CPU)
    for layer in range(2):
        list(cache.layer_waves(layer, torch.arange(6).view(3, 2)))  # 12 experts fill the pool
    before = cache.slot_map.clone()
    cache.evict_from(9)
    assert (cache.slot_owners[9:] == -1).all() and (cache.slot_owners[:9] >= 0).all()
    kept = before < 9
    assert torch.equal(cache.slot_map[kept], before[kept]) and (cache.slot_map[~kept] == -1).all()
    lent = cache.lend(4, below=9)
    assert (lent < 9).all() and len(set(lent.tolist())) == 4
    with pytest.raises(ValueError, match="cannot lend"):
        cache.lend(10, below=9)
    with pytest.raises(ValueError, match="no slot 13"):
        cache.evict_from(13)


def test_lent_tail_streams_bitwise_and_comes_back_for_planned_steps(store: BankStore) -> None:
    ex, resident = _lending_executor(store), make_executor("resident", store, CPU, F.silu, L, 0)
    lending, first = ex.lending, SLOTS - TAIL
    g = torch.Generator().manual_seed(5)
    for T in (4, 3, 2):  # planned steps fill the pool, the tail too
        _run(ex, resident, g, T)
    assert (ex.cache.slot_owners[first:] >= 0).any() and not lending.lent
    for T in (9, 7):  # one prompt's two streamed chunks: one loan
        _run(ex, resident, g, T)
        assert lending.lent and lending.loans == 1
        assert (ex.cache.slot_owners[first:] == -1).all()  # nothing lives in the lent memory
        assert (torch.from_numpy(ex.streaming._buffers) < first).all()  # nor the double buffer
    _run(ex, resident, g, 3, num_decode=3)  # a decode step: the tail back before it plans
    assert not lending.lent
    _run(ex, resident, g, 11, num_decode=4)  # decode rows beside a long chunk: a second loan
    assert lending.lent and lending.loans == 2
    _run(ex, resident, g, 2)
    assert not lending.lent and ex.stats.snapshot()["slot_loans"] == 2


def test_a_streamed_chunk_without_the_step_hook_still_borrows(store: BankStore) -> None:
    ex, resident = _lending_executor(store), make_executor("resident", store, CPU, F.silu, L, 0)
    g = torch.Generator().manual_seed(6)
    _run(ex, resident, g, 8, hook=False)  # a direct caller: the first streamed layer lends
    assert ex.lending.lent and (ex.cache.slot_owners[SLOTS - TAIL:] == -1).all()
    ex.recover()  # after a failed step the tail comes back with the cache cleared
    assert not ex.lending.lent


class _Banks:
    """The banks' lendable side alone: 1,000 bytes, 300 of them lent."""

    tail_bytes = 300

    def __init__(self) -> None:
        self.mapped = True

    @property
    def outside_allocator(self) -> int:
        return 1000 if self.mapped else 700

    def release_tail(self) -> None:
        self.mapped = False

    def map_tail(self) -> None:
        self.mapped = True


def test_torch_limit_follows_the_lent_bytes() -> None:
    cache, banks, limits = DeviceSlotCache(10, 1, 4, CPU), _Banks(), []
    lending = SlotLending(cache, banks, 3, 100)  # type: ignore[arg-type]
    lending.attach_limit(limits.append)
    lending.before_step(99)  # too short to stream: nothing lent
    lending.before_step(100)
    lending.before_step(5000)
    lending.before_step(0)
    assert limits == [1000, 700, 1000] and banks.mapped and lending.loans == 1
    with pytest.raises(ValueError, match="cannot lend"):
        SlotLending(cache, banks, 10, 100)  # type: ignore[arg-type]


def test_loaned_cells_are_a_buffer_of_their_own() -> None:
    from edgemoe.moe.executor import CellWorkspace

    ws = CellWorkspace(4, H, CPU, loaned=True)
    short = ws.cells(torch.zeros(3, K, dtype=torch.int32))
    long = ws.cells(torch.zeros(9, K, dtype=torch.int32))
    assert short.shape == (3, K, H) and long.shape == (9, K, H) and ws.buffer.shape[0] == 4
    assert long.data_ptr() != short.data_ptr() and ws.loaned_buffer is not None
    ws.drop_loaned()
    assert ws.loaned_buffer is None and ws.cells(torch.zeros(2, K, dtype=torch.int32)).data_ptr() == short.data_ptr()
