"""What this process holds on a GPU, so `--gpu-memory` caps this process alone.

`torch.cuda.mem_get_info` counts the whole device: a desktop's compositor, a second
engine, or the pytest process that spawned this one all look like our CUDA context, and
a cap planned on top of them is smaller than it should be. The driver's count of the
device's use taken *before* this process makes its context there (`baseline`) is what the
others hold; afterwards our share is the count now less that. Both counts come from NVML:
its total is not CUDA's (CUDA's leaves out memory the driver reserves, ~0.6 GiB on an
H200), so only a difference of two NVML counts is ours.

Read through NVML and the driver API with ctypes (both ship with the driver: no extra
package). When they are missing, or this process already has a context on the device (its
memory would count as the others'), `baseline` is None and the caller counts the whole
device's use as ours: over-conservative, never over the cap.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _uuid_text(raw: bytes) -> str:
    """The driver's 16 UUID bytes as NVML names a GPU: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _device_uuid_without_context(ordinal: int) -> str | None:
    """The UUID of CUDA device `ordinal` (as CUDA_VISIBLE_DEVICES numbers it), or None when
    this process already has its primary context there (or the driver API is unavailable)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0 or active.value:
        return None
    raw = ctypes.create_string_buffer(16)
    if cuda.cuDeviceGetUuid(raw, dev) != 0:
        return None
    return _uuid_text(raw.raw)


def _nvml_used(uuid: str) -> int | None:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle, mem = ctypes.c_void_p(), _NvmlMemory()
        if nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
            return None
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
            return None
        # total - free, as torch.cuda.mem_get_info counts (NVML's `used` leaves out what the
        # driver reserves on some versions)
        return int(mem.total - mem.free)
    finally:
        nvml.nvmlShutdown()


class Baseline:
    """The device's use (NVML: total - free) before this process's context existed."""

    def __init__(self, uuid: str, used: int) -> None:
        self.uuid, self.used = uuid, used

    def ours(self) -> int | None:
        """What this process holds now (the count now less the baseline); None if NVML fails."""
        now = _nvml_used(self.uuid)
        return None if now is None else max(0, now - self.used)


def baseline(ordinal: int) -> Baseline | None:
    """CUDA device `ordinal`'s use before this process's context exists there; None when
    that can't be told (see the module doc)."""
    try:
        uuid = _device_uuid_without_context(ordinal)
        used = None if uuid is None else _nvml_used(uuid)
        return None if uuid is None or used is None else Baseline(uuid, used)
    except (OSError, AttributeError) as e:  # no driver library, or an older one without a symbol
        log.debug("cannot read the device's memory before our context: %s", e)
        return None


def process_share(total: int, free: int, ours: int | None, requested: int | None) -> tuple[int, int]:
    """(cap, context): what this process holds now (`ours`; when unknown, the whole device's
    use, total - free) and the cap it plans under: `requested` (--gpu-memory) or 90% of
    the device, never more than it holds plus what is free."""
    context = total - free if ours is None else ours
    cap = requested if requested is not None else int(0.9 * total)
    return min(cap, context + free), context
