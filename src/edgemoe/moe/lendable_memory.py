"""Device memory at a fixed virtual address whose tail can be handed back to the driver
and mapped again: the slot banks' tail, lent as a long prompt chunk's workspace
(`moe/slot_lending.py`).

Why a fixed address: CUDA graphs captured over the banks (the decode step reads slots by
address) stay valid only if the banks never move. So the virtual range is reserved once
(`cuMemAddressReserve`) and physical memory is mapped into it (`cuMemCreate` +
`cuMemMap`): the head for good, the tail as one allocation that `release_tail` unmaps and
frees (the driver, and torch's caching allocator through it, can use those bytes) and
`map_tail` creates and maps again at the same addresses. The tail's contents are lost: the
caller has emptied those slots first, and waited for every reader.

Through the driver API with ctypes (it ships with the driver: no extra package). Where the
device has no virtual memory management, or on a CPU (tests), the buffer is a plain tensor
that lends nothing (`tail_bytes` 0) and `release_tail` / `map_tail` only flip `lent`.

The memory is freed when the last tensor over it is gone (torch holds the array interface
the tensors were made from; a finaliser on it), on whichever thread drops it: the context
is pushed for those calls.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import weakref

import torch

from edgemoe.moe.pinning import CudaArray

log = logging.getLogger(__name__)

ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
PROT_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
GRANULARITY_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM
ATTR_VMM_SUPPORTED = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class VmmError(RuntimeError):
    """A driver call of the lendable memory failed (its name and CUresult said)."""


@functools.cache
def _driver() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    names = ("cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
             "cuMemSetAccess", "cuMemGetAllocationGranularity", "cuDeviceGet", "cuDeviceGetAttribute",
             "cuCtxGetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2")
    if not all(hasattr(lib, n) for n in names):
        return None
    for n in names:
        getattr(lib, n).restype = ctypes.c_int
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise VmmError(f"{what} failed (CUresult {rc})")


def _prop(ordinal: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type, prop.location = ALLOCATION_PINNED, _Location(LOCATION_DEVICE, ordinal)
    return prop


def vmm_granularity(device: torch.device) -> int | None:
    """Bytes a mapping is made of on `device` (its allocations and offsets are multiples),
    or None where the lendable memory can't be made (a CPU, no driver support)."""
    lib = _driver()
    if device.type != "cuda" or lib is None:
        return None
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    dev, flag = ctypes.c_int(), ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None
    if lib.cuDeviceGetAttribute(ctypes.byref(flag), ATTR_VMM_SUPPORTED, dev) != 0 or not flag.value:
        return None
    gran = ctypes.c_size_t()
    prop = _prop(ordinal)
    if lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), GRANULARITY_MINIMUM) != 0:
        return None
    return int(gran.value)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Mapping:
    """The driver objects of one buffer: the reserved range and its two allocations."""

    def __init__(self, ordinal: int, size: int, head: int) -> None:
        lib = _driver()
        assert lib is not None
        self.lib, self.ordinal, self.size, self.head = lib, ordinal, size, head
        self.context = ctypes.c_void_p()
        _check(lib.cuCtxGetCurrent(ctypes.byref(self.context)), "cuCtxGetCurrent")
        if not self.context.value:
            raise VmmError("no current CUDA context (torch has not initialised the device)")
        self.base = ctypes.c_uint64()
        _check(lib.cuMemAddressReserve(ctypes.byref(self.base), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                       ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
        self.handles: dict[int, tuple[ctypes.c_uint64, int]] = {}  # offset -> (allocation mapped there, bytes)
        try:
            if head:
                self.map(0, head)
            if size > head:
                self.map(head, size - head)
        except VmmError:
            self.free()
            raise

    def map(self, offset: int, nbytes: int) -> None:
        lib, handle, prop = self.lib, ctypes.c_uint64(), _prop(self.ordinal)
        _check(lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(nbytes), ctypes.byref(prop), ctypes.c_uint64(0)),
               f"cuMemCreate ({nbytes} bytes)")
        addr = ctypes.c_uint64(self.base.value + offset)
        rc = lib.cuMemMap(addr, ctypes.c_size_t(nbytes), ctypes.c_size_t(0), handle, ctypes.c_uint64(0))
        if rc != 0:
            lib.cuMemRelease(handle)
            _check(rc, "cuMemMap")
        self.handles[offset] = (handle, nbytes)
        access = _AccessDesc(_Location(LOCATION_DEVICE, self.ordinal), PROT_READWRITE)
        _check(lib.cuMemSetAccess(addr, ctypes.c_size_t(nbytes), ctypes.byref(access), ctypes.c_size_t(1)),
               "cuMemSetAccess")

    def unmap(self, offset: int) -> None:
        handle, nbytes = self.handles.pop(offset)
        _check(self.lib.cuMemUnmap(ctypes.c_uint64(self.base.value + offset), ctypes.c_size_t(nbytes)), "cuMemUnmap")
        _check(self.lib.cuMemRelease(handle), "cuMemRelease")

    def free(self) -> None:
        """Everything back to the driver (the finaliser; errors only logged: nothing can use them)."""
        lib = self.lib
        pushed = lib.cuCtxPushCurrent_v2(self.context) == 0
        try:
            for offset in sorted(self.handles, reverse=True):
                try:
                    self.unmap(offset)
                except VmmError as e:
                    log.warning("lendable memory: %s", e)
            if lib.cuMemAddressFree(ctypes.c_uint64(self.base.value), ctypes.c_size_t(self.size)) != 0:
                log.warning("lendable memory: cuMemAddressFree failed")
        finally:
            if pushed:
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


class LendableBuffer:
    """`nbytes` of device memory as a uint8 tensor (`tensor`) whose bytes past `keep`
    (rounded up to the mapping granularity) can be lent: `release_tail()` gives them to
    the driver, `map_tail()` takes them back at the same address, contents undefined.
    `tail_bytes`: how many bytes a loan frees (0 where nothing can be lent)."""

    def __init__(self, nbytes: int, keep: int, device: torch.device) -> None:
        self.device, self.nbytes, self.lent = device, nbytes, False
        gran = vmm_granularity(device)
        head = min(_round_up(max(keep, 0), gran), _round_up(nbytes, gran)) if gran else nbytes
        if gran is None or head >= _round_up(nbytes, gran):  # nothing to lend: a plain tensor
            self.tail_bytes, self._mapping = 0, None
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
            return
        ordinal = device.index if device.index is not None else torch.cuda.current_device()
        size = _round_up(nbytes, gran)
        with torch.cuda.device(ordinal):
            torch.cuda.synchronize()  # the device's primary context made and current on this thread
            self._mapping = _Mapping(ordinal, size, head)
            self.tail_bytes = size - head
            interface = CudaArray(self._mapping.base.value, (nbytes,))  # torch keeps it while a tensor lives
            weakref.finalize(interface, self._mapping.free)
            self.tensor = torch.as_tensor(interface, device=device)

    @property
    def outside_allocator(self) -> int:
        """Bytes mapped outside torch's caching allocator now (0 for a plain tensor)."""
        return 0 if self._mapping is None else self.nbytes - (self.tail_bytes if self.lent else 0)

    def release_tail(self) -> None:
        """Unmap the tail and free its memory. The caller has waited for every reader."""
        if self.lent:
            return
        if self._mapping is not None:
            self._mapping.unmap(self._mapping.head)
        self.lent = True

    def map_tail(self) -> None:
        """Map fresh memory under the tail again (raises VmmError if the driver has none)."""
        if not self.lent:
            return
        if self._mapping is not None:
            self._mapping.map(self._mapping.head, self.tail_bytes)
        self.lent = False
