"""bench/allocator.py: the allocator's counters as a phase's differences (CUDA faked)."""

from __future__ import annotations

import pytest
import torch

from edgemoe.bench import allocator


def test_cpu_device_reports_nothing() -> None:
    cpu = torch.device("cpu")
    assert allocator.allocator_snapshot(cpu) == {}
    assert allocator.allocator_traffic(cpu, {}) == {}


def test_phase_counts_are_differences_and_the_peak_is_the_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"num_alloc_retries": 2, "num_device_alloc": 10, "num_device_free": 1,
             "reserved_bytes.all.peak": 8 * 2**30}
    resets: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: dict(state))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    gpu = torch.device("cuda", 0)
    before = allocator.allocator_snapshot(gpu)
    assert resets == [gpu]  # the next peak is this phase's
    state.update(num_alloc_retries=5, num_device_alloc=13, num_device_free=4, **{"reserved_bytes.all.peak": 3 * 2**30})
    got = allocator.allocator_traffic(gpu, before)
    assert got == {"num_alloc_retries": 3, "num_device_alloc": 3, "num_device_free": 3, "reserved_peak_gib": 3.0}
