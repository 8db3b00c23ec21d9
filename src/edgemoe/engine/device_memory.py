"""What this process holds on a GPU, so `--gpu-memory` caps this process alone.

`torch.cuda.mem_get_info` counts the whole device: a desktop's compositor, a second
engine, or the pytest process that spawned this one all look like our CUDA context, and
a cap planned on top of them is smaller than it should be. The driver's count of the
device's use taken *before* this process makes its context there (`baseline`) is what the
others hold; afterwards our share is the count now less that. Both counts come from NVML:
its total is not CUDA's (CUDA's leaves out memory the driver reserves, ~0.6 GiB on an
H200), so only a difference of two NVML counts is ours.

The first baseline read on a device is kept for the life of the process: a later engine
in the same process (a notebook's second `LLM`, a benchmark's next configuration) finds our
context already there and could not read one, yet our share is still the count now less
that first one — whatever an earlier engine left counts as ours, as it should.

Read through NVML and the driver API with ctypes (both ship with the driver: no extra
package). When they are missing, or this process already had a context on the device
before any baseline was read there (its memory would count as the others'), `baseline` is
None and the caller counts the whole device's use as ours: over-conservative, never over
the cap.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from edgemoe.engine.budget import MemoryPlan

log = logging.getLogger(__name__)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _uuid_text(raw: bytes) -> str:
    """The driver's 16 UUID bytes as NVML names a GPU: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _device_state(ordinal: int) -> tuple[str, bool] | None:
    """(UUID, whether this process has its primary context there) of CUDA device `ordinal`
    (as CUDA_VISIBLE_DEVICES numbers it); None when the driver API can't say."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
        return None
    raw = ctypes.create_string_buffer(16)
    if cuda.cuDeviceGetUuid(raw, dev) != 0:
        return None
    return _uuid_text(raw.raw), bool(active.value)


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

    def ours(self, floor: int = 0) -> int | None:
        """What this process holds now (the count now less the baseline), never less than
        `floor` (what we know we hold: torch's caching allocator); None if NVML fails.
        NOTE: others' use can fall after the baseline (a process exits), and a difference
        taken long after it (a later engine) would then count too little as ours."""
        now = _nvml_used(self.uuid)
        return None if now is None else max(floor, now - self.used)


# NOTE: module state on purpose: a baseline is a fact about this process, not about one
# engine. It is read once per device, before our first context there, and stays true for
# the life of the process (torch never releases the primary context it makes);
# after that context exists it can never be read again. Keyed by UUID, which names the
# device whatever CUDA_VISIBLE_DEVICES numbered it.
_BASELINES: dict[str, Baseline] = {}


def baseline(ordinal: int) -> Baseline | None:
    """CUDA device `ordinal`'s use before this process's context existed there: read now if
    there is no context yet, else the one read then; None when that can't be told (see the
    module doc)."""
    try:
        state = _device_state(ordinal)
        if state is None:
            return None
        uuid, has_context = state
        if uuid in _BASELINES:
            return _BASELINES[uuid]
        used = None if has_context else _nvml_used(uuid)
        if used is None:
            return None
        _BASELINES[uuid] = Baseline(uuid, used)
        return _BASELINES[uuid]
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


def allocator_limit(plan: MemoryPlan, device: torch.device) -> Callable[[int], None]:
    """Sets torch's caching allocator limit to the budget less what the process holds
    outside it: what it held before planning (cuBLAS's workspace, tensors a caller or an
    earlier engine kept: in the measured context already) and `held` bytes more (slot
    banks mapped outside the allocator, `moe/lendable_memory.py`). An overrun is then an
    OOM, not a surprise."""
    import torch

    assert plan.budget is not None
    total = torch.cuda.mem_get_info(device)[1]
    outside = max(0, plan.context - torch.cuda.memory_reserved(device))

    def set_limit(held: int) -> None:
        torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, (plan.budget - outside - held) / total)), device)

    return set_limit
