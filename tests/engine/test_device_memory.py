"""engine/device_memory.py against fake driver libraries: the baseline is read only while
this process has no context on the device, by the device's UUID, as NVML's total - free,
and our share is a difference of two such counts; anything missing answers None (the
caller then counts the whole device's use as its own)."""

from __future__ import annotations

import ctypes

import pytest

from edgemoe.engine import device_memory

UUID = bytes(range(0xA0, 0xB0))


class FakeCuda:
    def __init__(self, active: int) -> None:
        self.active = active

    def cuInit(self, flags: int) -> int:  # noqa: N802  (the driver's names)
        return 0

    def cuDeviceGet(self, dev, ordinal: int) -> int:  # noqa: ANN001, N802
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, dev, flags, active) -> int:  # noqa: ANN001, N802
        active._obj.value = self.active
        return 0

    def cuDeviceGetUuid(self, buf, dev) -> int:  # noqa: ANN001, N802
        ctypes.memmove(buf, UUID, 16)
        return 0


class FakeNvml:
    def __init__(self) -> None:
        self.asked: list[bytes] = []
        self.shut = False

    def nvmlInit_v2(self) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes, handle) -> int:  # noqa: ANN001, N802
        self.asked.append(uuid)
        return 0

    free = 77 << 30

    def nvmlDeviceGetMemoryInfo(self, handle, mem) -> int:  # noqa: ANN001, N802
        mem._obj.total, mem._obj.free, mem._obj.used = 80 << 30, self.free, 2 << 30
        return 0

    def nvmlShutdown(self) -> int:  # noqa: N802
        self.shut = True
        return 0


def fake_libraries(monkeypatch: pytest.MonkeyPatch, active: int) -> FakeNvml:
    nvml = FakeNvml()
    libs = {"libcuda.so.1": FakeCuda(active), "libnvidia-ml.so.1": nvml}
    monkeypatch.setattr(device_memory.ctypes, "CDLL", lambda name: libs[name])
    return nvml


def test_reads_the_device_by_uuid_and_our_share_as_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_libraries(monkeypatch, active=0)
    before = device_memory.baseline(0)
    assert before is not None and before.used == 3 << 30  # total - free, not NVML's `used`
    assert nvml.asked == [b"GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"] and nvml.shut
    nvml.free -= 1 << 29  # our context and allocations since
    assert before.ours() == 1 << 29


def test_a_context_already_here_means_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_libraries(monkeypatch, active=1)
    assert device_memory.baseline(0) is None and nvml.asked == []


def test_no_driver_library_means_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(device_memory.ctypes, "CDLL", missing)
    assert device_memory.baseline(0) is None


GiB = 1 << 30


def test_the_cap_counts_this_process_and_never_exceeds_what_is_free() -> None:
    # 80 GiB device, others hold 3 GiB, our context 0.5 GiB: 76.5 GiB free
    total, ours, free = 80 * GiB, GiB // 2, int(76.5 * GiB)
    assert device_memory.process_share(total, free, ours, 16 * GiB) == (16 * GiB, ours)
    assert device_memory.process_share(total, free, ours, None) == (int(0.9 * total), ours)
    assert device_memory.process_share(total, free, ours, 100 * GiB) == (77 * GiB, ours)
    # others holding 20 GiB: the default 90% of the device is more than is left
    assert device_memory.process_share(total, int(59.5 * GiB), ours, None) == (60 * GiB, ours)
    # our share unknown: the whole device's use is ours (a smaller plan, never an overrun)
    assert device_memory.process_share(total, free, None, 16 * GiB) == (16 * GiB, int(3.5 * GiB))
