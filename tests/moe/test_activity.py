"""Per-(layer, expert) activity for the live view, checked against what the routing and the
slot map say independently: routed experts resident before a layer are hits, the others
misses (or CPU work); the map's residency is the slot map after; unwatched, nothing is marked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgemoe.moe.activity import CPU, HIT, MISS, ExpertActivity
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore

L, E, K, H, I = 3, 8, 2, 16, 12


@pytest.fixture(scope="module")
def store() -> BankStore:
    g = torch.Generator().manual_seed(0)
    s = BankStore.allocate(list(range(L)), E, H, I, torch.float32)
    for b in s.banks.values():
        b.gate_up.copy_(torch.randn(b.gate_up.shape, generator=g))
        b.down.copy_(torch.randn(b.down.shape, generator=g))
    return s


def test_codes_strongest_event_then_residency() -> None:
    a = ExpertActivity(2, 4)
    a.mark(0, [1, 2], HIT)
    a.mark(0, [2], MISS)
    a.mark(0, [2], HIT)  # a weaker event later does not hide the miss
    a.mark(1, [3], CPU)
    resident = np.array([[True, False, True, False], [False, True, False, False]])
    assert a.take([0, 1], resident) == ["1230", "0104"]
    assert a.take([1], None) == ["1111"]  # cleared; None = everything resident
    a.mark_counts(np.array([[0, 2, 0, 0], [1, 0, 0, 0]]), HIT)
    assert a.take([0, 1], None) == ["1211", "2111"]


def _step(executor, layer: int, ids: torch.Tensor) -> None:  # noqa: ANN001
    x = torch.randn(ids.shape[0], H)
    w = torch.full(ids.shape, 1.0 / K)
    executor.forward(layer, x, ids, w)


@pytest.mark.parametrize("backend", ["offload", "cpu"])
def test_offload_and_cpu_marks_agree_with_the_slot_map(store: BankStore, backend: str) -> None:
    ex = make_executor(backend, store, torch.device("cpu"), F.silu, L, num_slots=5)
    g = torch.Generator().manual_seed(3)
    _step(ex, 0, torch.tensor([[0, 1]]))  # unwatched: nothing to mark, nothing allocated
    assert ex.stats.activity is None
    ex.stats.watch(E)
    for _ in range(6):
        layer = int(torch.randint(L, (1,), generator=g))
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(3)])
        before = ex.resident_mask()[layer].copy()
        _step(ex, layer, ids)
        routed = set(ids.unique().tolist())
        cells = ex.stats.activity.take(list(range(L)), ex.resident_mask())
        after = ex.resident_mask()
        missed = "4" if backend == "cpu" else "3"  # cpu: every miss runs on the host
        for e in range(E):
            if e in routed:
                want = "2" if before[e] else missed
            else:
                want = "1" if after[layer, e] else "0"
            assert cells[layer][e] == want, (layer, e, cells[layer])
        others = [c for i, c in enumerate(cells) if i != layer]
        assert all(set(row) <= {"0", "1"} for row in others)  # other layers did nothing
    ex.stats.watch(None)
    assert ex.stats.activity is None


def test_resident_marks_come_from_device_marks_only_while_watched(store: BankStore) -> None:
    ex = make_executor("resident", store, torch.device("cpu"), F.silu, L, 0)
    _step(ex, 0, torch.tensor([[1, 2]]))  # unwatched: nothing kept per expert
    assert ex.stats.routed is None and ex.stats.activity is None
    ex.stats.watch(E)
    _step(ex, 1, torch.tensor([[0, 5], [5, 7]]))
    _step(ex, 2, torch.tensor([[3, 4]]))
    ex.stats.resolve()
    assert ex.stats.activity.take(list(range(L)), ex.resident_mask()) == ["11111111", "21111212", "11122111"]
    x = torch.randn(3, H)  # a padded batch: the padding row's routing is not marked
    ex.forward(0, x, torch.tensor([[6, 7], [6, 6], [0, 1]]), torch.full((3, K), 0.5), num_padding=1)
    ex.stats.resolve()
    assert ex.stats.activity.take([0], None) == ["11111122"]
    ex.stats.watch(None)
    assert ex.stats.routed is None and ex.stats.activity is None
