"""engine/device_memory.py against fake driver libraries: the baseline is read only while
this process has no context on the device, by the device's UUID, as NVML's total - free,
then kept per device for later engines in the process; our share is a difference of two
such counts; anything missing answers None (the caller then counts the whole device's use
as its own)."""

from __future__ import annotations

import ctypes

import pytest

from edgemoe.engine import device_memory


def uuid_bytes(ordinal: int) -> bytes:
    return bytes(range(0xA0 + 16 * ordinal, 0xB0 + 16 * ordinal))


UUID = uuid_bytes(0)
UUID1_TEXT = b"GPU-b0b1b2b3-b4b5-b6b7-b8b9-babbbcbdbebf"


class FakeCuda:
    """Devices 0 and 1, each with its own UUID; `contexts`: where this process has one."""

    def __init__(self, active: int) -> None:
        self.contexts = {0} if active else set()

    def cuInit(self, flags: int) -> int:  # noqa: N802  (the driver's names)
        return 0

    def cuDeviceGet(self, dev, ordinal: int) -> int:  # noqa: ANN001, N802
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, dev, flags, active) -> int:  # noqa: ANN001, N802
        active._obj.value = int(dev.value in self.contexts)
        return 0

    def cuDeviceGetUuid(self, buf, dev) -> int:  # noqa: ANN001, N802
        ctypes.memmove(buf, uuid_bytes(dev.value), 16)
        return 0


class FakeNvml:
    def __init__(self) -> None:
        self.asked: list[bytes] = []
        self.shut = False
        self.free_by_uuid: dict[bytes, int] = {}

    def nvmlInit_v2(self) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes, handle) -> int:  # noqa: ANN001, N802
        self.asked.append(uuid)
        handle._obj.value = len(self.asked)  # the handle names the UUID asked last
        return 0

    free = 77 << 30

    def nvmlDeviceGetMemoryInfo(self, handle, mem) -> int:  # noqa: ANN001, N802
        free = self.free_by_uuid.get(self.asked[-1], self.free)
        mem._obj.total, mem._obj.free, mem._obj.used = 80 << 30, free, 2 << 30
        return 0

    def nvmlShutdown(self) -> int:  # noqa: N802
        self.shut = True
        return 0


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a process that has read no baseline yet."""
    monkeypatch.setattr(device_memory, "_BASELINES", {})


def fake_libraries(monkeypatch: pytest.MonkeyPatch, active: int) -> tuple[FakeCuda, FakeNvml]:
    cuda, nvml = FakeCuda(active), FakeNvml()
    libs = {"libcuda.so.1": cuda, "libnvidia-ml.so.1": nvml}
    monkeypatch.setattr(device_memory.ctypes, "CDLL", lambda name: libs[name])
    return cuda, nvml


def test_reads_the_device_by_uuid_and_our_share_as_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    _, nvml = fake_libraries(monkeypatch, active=0)
    before = device_memory.baseline(0)
    assert before is not None and before.used == 3 << 30  # total - free, not NVML's `used`
    assert nvml.asked == [b"GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"] and nvml.shut
    nvml.free -= 1 << 29  # our context and allocations since
    assert before.ours() == 1 << 29


def test_a_context_already_here_means_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    _, nvml = fake_libraries(monkeypatch, active=1)
    assert device_memory.baseline(0) is None and nvml.asked == []


def test_a_later_engine_gets_the_first_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, nvml = fake_libraries(monkeypatch, active=0)
    first = device_memory.baseline(0)
    assert first is not None and first.used == 3 << 30
    cuda.contexts.add(0)  # the first engine made our context ...
    nvml.free -= 5 << 30  # ... and it plus what that engine left hold 5 GiB
    again = device_memory.baseline(0)
    assert again is first and again.ours() == 5 << 30  # not the device's 8 GiB, not unknown


def test_baselines_are_kept_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, nvml = fake_libraries(monkeypatch, active=0)
    first = device_memory.baseline(0)
    cuda.contexts.update({0, 1})
    assert device_memory.baseline(1) is None  # device 1 had our context before any reading there
    cuda.contexts.discard(1)
    nvml.free_by_uuid[UUID1_TEXT] = 70 << 30
    other = device_memory.baseline(1)
    assert other is not None and other.uuid == UUID1_TEXT.decode() and other.used == 10 << 30
    assert device_memory.baseline(0) is first and device_memory.baseline(1) is other


def test_our_share_never_falls_below_what_we_know_we_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    _, nvml = fake_libraries(monkeypatch, active=0)
    before = device_memory.baseline(0)
    assert before is not None
    nvml.free += 2 << 30  # another process exited and gave back more than our context holds
    assert before.ours() == 0 and before.ours(floor=1 << 30) == 1 << 30


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
