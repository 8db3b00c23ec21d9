"""The hybrid/auto executors with the live controller: the start-up probe's arithmetic
(on a simulated clock), the controller fed by real layers, auto's choice logged and
honoured (no activations read back in offload), results bitwise resident (fp32)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgemoe.moe import cpu as cpu_module
from edgemoe.moe import rate_probe
from edgemoe.moe.controller import Rates
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore

L, E, K, H, I = 3, 8, 2, 16, 12


@pytest.fixture(scope="module")
def store() -> BankStore:
    g = torch.Generator().manual_seed(0)
    s = BankStore.allocate(list(range(L)), E, H, I, torch.float32)
    for b in s.banks.values():
        b.gate_up.copy_(torch.randn(b.gate_up.shape, generator=g) / H**0.5)
        b.down.copy_(torch.randn(b.down.shape, generator=g) / I**0.5)
    return s


def routings(seed: int, steps: int):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        T = [1, 1, 4][step % 3]
        yield (torch.randn(T, H, generator=g), torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]),
               torch.softmax(torch.randn(T, K, generator=g), -1))


def test_probe_derives_the_cpu_law_from_its_timings(store: BankStore, monkeypatch) -> None:  # noqa: ANN001
    # A CPU job costing 2 ms + 4 ms per expert + 1 ms per token, on a clock only the job advances.
    clock = [0.0]
    monkeypatch.setattr(rate_probe.time, "perf_counter", lambda: clock[0])

    def job(layer: int, experts: list[int], x: torch.Tensor, ids: np.ndarray, w: torch.Tensor) -> None:
        assert ids.shape == (x.shape[0], len(experts)) and set(ids.ravel()) == set(experts)
        clock[0] += 2e-3 + 4e-3 * len(experts) + 1e-3 * ids.size

    slots = torch.empty(8, 2 * I, H), torch.empty(8, H, I)
    rates = rate_probe.probe_rates(store, *slots, job)
    assert rates.cpu_s == pytest.approx(5e-3)  # one expert at one token: 4 + 1 ms
    assert rates.cpu_token_s == pytest.approx(1e-3) and rates.cpu_call_s == pytest.approx(2e-3)
    assert rates.copy_s == 0.0  # the copies did not advance this clock


def fixed_rates(monkeypatch, rates: Rates) -> None:  # noqa: ANN001
    monkeypatch.setattr(cpu_module, "probe_rates", lambda *a: rates)


FAST_CPU = Rates(copy_s=1e-3, cpu_s=1e-5, cpu_token_s=1e-6, cpu_call_s=1e-6)
SLOW_CPU = Rates(copy_s=1e-5, cpu_s=1e-2, cpu_token_s=1e-4, cpu_call_s=1e-3)


@pytest.mark.parametrize("rates,on_cpu", [(FAST_CPU, True), (SLOW_CPU, False)], ids=["fast-cpu", "slow-cpu"])
def test_hybrid_follows_its_controller_and_stays_bitwise(store, monkeypatch, rates, on_cpu) -> None:  # noqa: ANN001
    fixed_rates(monkeypatch, rates)
    resident = make_executor("resident", store, torch.device("cpu"), F.silu, L, 0)
    ex = make_executor("hybrid", store, torch.device("cpu"), F.silu, L, num_slots=4)
    for x, ids, w in routings(seed=1, steps=6):
        for layer in range(L):
            assert torch.equal(ex.forward(layer, x, ids, w), resident.forward(layer, x, ids, w))
    snap = ex.stats.snapshot()
    ctl = ex.controller
    # a layer's device timing is folded in at the next split (on the CPU it is known at once)
    assert snap["split"]["layers"] == 6 * L and ctl.device.observations == 6 * L - 1
    assert (snap["experts_cpu"] > 0) == on_cpu and (ctl.cpu.observations > 0) == on_cpu
    ex.close()


def test_auto_logs_its_choice_and_reads_no_activations_in_offload(store, monkeypatch, caplog) -> None:  # noqa: ANN001
    fixed_rates(monkeypatch, SLOW_CPU)
    with caplog.at_level(logging.WARNING, logger="edgemoe.moe.controller"):
        ex = make_executor("auto", store, torch.device("cpu"), F.silu, L, num_slots=4, top_k=K)
    assert ex.controller.choice == "offload" and "moe auto: offload:" in caplog.text
    x, ids, w = next(routings(seed=2, steps=1))
    ex.forward(0, x, ids, w)
    assert ex.readback._x is None and ex.stats.snapshot()["experts_cpu"] == 0
    fixed_rates(monkeypatch, FAST_CPU)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgemoe.moe.controller"):
        fast = make_executor("auto", store, torch.device("cpu"), F.silu, L, num_slots=4, top_k=K)
    assert fast.controller.choice == "hybrid" and "moe auto: hybrid:" in caplog.text
    ex.close()
    fast.close()


def test_the_real_probe_measures_positive_rates(store: BankStore) -> None:
    ex = make_executor("hybrid", store, torch.device("cpu"), F.silu, L, num_slots=4)
    r = ex.controller.rates
    assert r.copy_s > 0 and r.cpu_s > 0 and 0 <= r.cpu_token_s <= r.cpu_s and r.cpu_call_s >= 0
    assert ex.cache.num_resident == 0  # the probe's copies land in free slots, mapped to nothing
    ex.close()
