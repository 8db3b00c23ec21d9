"""Page-locking host memory in place, in the background.

`.pin_memory()` copies into a fresh pinned buffer (twice the RAM while it runs), and
pinned allocations round up; a filled pageable tensor can instead be registered with
the driver where it lies (`cudaHostRegister`). Registering is slow (~0.5 s per GiB on
the GPU machine), so `InPlacePinner` does it on a background thread while the caller
fills the next tensor: submit tensor l once it is written, fill l+1, and so on.

`PinWhenFilled` decides *when* a tensor is done for loaders whose pieces arrive in
file order, not tensor order (a checkpoint's experts are separate tensors, possibly
spread over shards): each tensor goes to the pinner once its last piece is written.

The registrar is an interface so the overlap logic is tested on CPU with a fake one.

`uva_view` maps a page-locked host tensor into the device's address space: a CUDA tensor
aliasing it, which device kernels read over PCIe (host-resident tables). NOTE: with unified
virtual addressing (every 64-bit CUDA platform) memory registered with default flags is
mapped and portable and the device may dereference the host pointer itself
(`cudaDevAttrCanUseHostPointerForRegisteredMem`); torch builds the alias from the
`__cuda_array_interface__` (checking the pointer is registered). The view holds no
reference to the host tensor: its owner keeps both.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

import torch
from tqdm import tqdm

log = logging.getLogger(__name__)


class PinError(RuntimeError):
    """The driver refused to page-lock a range (memlock limits, low RAM)."""


class Registrar(Protocol):
    """Page-locks host ranges in place. Contract: `register` either locks the whole range
    or raises; `unregister(ptr)` undoes a successful `register(ptr, …)`; both may be
    called from a thread other than the one that created the registrar."""

    def register(self, ptr: int, nbytes: int) -> None: ...

    def unregister(self, ptr: int) -> None: ...


class CudaRegistrar:
    """`cudaHostRegister` with default flags, for `device`'s context (current in the calling thread)."""

    def __init__(self, device: torch.device) -> None:
        if device.index is None:  # set_device needs an index: "cuda" means the current device
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device

    def register(self, ptr: int, nbytes: int) -> None:
        # NOTE: with flags 0 the range is pinned for the current context: set it in this thread.
        torch.cuda.set_device(self.device)
        err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
        if int(err) != 0:
            raise PinError(f"cudaHostRegister({nbytes / 2**30:.2f} GiB) failed with CUDA error {int(err)}")

    def unregister(self, ptr: int) -> None:
        torch.cuda.set_device(self.device)
        torch.cuda.cudart().cudaHostUnregister(ptr)


class InPlacePinner:
    """Registers host tensors page-locked in place, on one background thread, in the order
    they are submitted; all or nothing.

    Lifetime: a registered tensor is held until `release()`, so its memory is never
    freed while the driver still has it locked. `finish()` waits for every submission;
    if any registration failed it unregisters the rest, warns once and reports False
    (the memory stays usable, pageable). Owners call `release()` when the memory goes
    (BankStore does it when closed or collected). Not for concurrent submitters.
    """

    def __init__(self, registrar: Registrar, what: str = "host memory") -> None:
        self.registrar = registrar
        self.what = what
        self._queue: queue.SimpleQueue[torch.Tensor | None] = queue.SimpleQueue()
        self._held: list[tuple[torch.Tensor, int]] = []  # (tensor, ptr) registered, in order
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._finished = False
        self._submitted = 0  # bytes queued, for the progress bar

    @property
    def pinned_bytes(self) -> int:
        with self._lock:
            return sum(t.numel() * t.element_size() for t, _ in self._held)

    def submit(self, tensor: torch.Tensor) -> None:
        """Queue a filled, contiguous host tensor for registration; returns at once."""
        if self._finished:
            raise RuntimeError("InPlacePinner.submit after finish()")
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("only contiguous host tensors can be registered in place")
        if tensor.numel() == 0:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="edgemoe-pin", daemon=True)
            self._thread.start()
        self._submitted += tensor.numel() * tensor.element_size()
        self._queue.put(tensor)

    def finish(self, progress: bool = False) -> bool:
        """Wait for every registration (`progress`: a bar while it takes); True if all succeeded."""
        if not self._finished:
            self._finished = True
            if self._thread is not None:
                self._queue.put(None)
                self._wait(self._thread, progress)
            if self._error is not None:
                self.release()
                log.warning("pinning the %s failed (%s); using pageable memory (slower copies)", self.what, self._error)
        return self._error is None

    def _wait(self, thread: threading.Thread, progress: bool) -> None:
        # Pinning tens of GB takes tens of seconds: show how far it got (GB registered).
        with tqdm(total=round(self._submitted / 1e9, 2), desc="pinning experts", unit="GB", leave=False,
                  disable=not progress, bar_format="{desc}: {n:.1f}/{total:.1f} GB {bar} {elapsed}") as bar:
            while thread.is_alive():
                thread.join(0.25)
                bar.update(round(self.pinned_bytes / 1e9, 2) - bar.n)

    def release(self) -> None:
        """Unregister everything registered (idempotent); the tensors are dropped after."""
        with self._lock:
            held, self._held = self._held, []
        for _, ptr in reversed(held):
            try:
                self.registrar.unregister(ptr)
            except Exception as exc:  # at interpreter exit the driver may be gone already
                log.debug("unregistering host memory at %#x failed: %s", ptr, exc)

    def _run(self) -> None:
        while (tensor := self._queue.get()) is not None:
            if self._error is not None:
                continue  # all or nothing: after a failure, drain without registering
            ptr = tensor.data_ptr()
            try:
                self.registrar.register(ptr, tensor.numel() * tensor.element_size())
            except BaseException as exc:  # a driver error must not kill the loader silently
                self._error = exc
                continue
            with self._lock:
                self._held.append((tensor, ptr))


class PinWhenFilled:
    """Submits each tensor to `pinner` as soon as every piece expected in it is written.

    `expected`: tensor name → (the tensor, names of the pieces that fill it). The loader
    calls `filled(tensor name, piece name)` after writing a piece; a piece counted twice
    (a duplicate in the checkpoint) counts once. Tensors still incomplete at the end are
    left pageable by the caller's error path (a missing tensor is a load error anyway).
    """

    def __init__(self, pinner: InPlacePinner, expected: dict[str, tuple[torch.Tensor, set[str]]]) -> None:
        self.pinner = pinner
        self._tensors = {name: tensor for name, (tensor, _) in expected.items()}
        self._missing = {name: set(pieces) for name, (_, pieces) in expected.items()}

    def filled(self, name: str, piece: str) -> None:
        missing = self._missing.get(name)
        if missing is None or piece not in missing:
            return
        missing.discard(piece)
        if not missing:  # the last piece: register it while the loader reads on
            del self._missing[name]
            self.pinner.submit(self._tensors.pop(name))

    @property
    def pending(self) -> list[str]:
        """Tensors with pieces still to come."""
        return sorted(self._missing)


_INT_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}  # by element size: viewed back to the dtype


class CudaArray:
    """The CUDA array interface of contiguous memory at device-visible address `ptr`: a
    `shape` of integers of `itemsize` bytes (view the tensor back to its dtype). Torch keeps
    the object alive as long as a tensor made from it (`torch.as_tensor`) lives."""

    def __init__(self, ptr: int, shape: tuple[int, ...], itemsize: int = 1) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": _INT_TYPESTR[itemsize], "data": (ptr, False), "version": 3, "strides": None,
        }


def uva_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor over the registered (page-locked) contiguous host tensor `host`."""
    assert host.is_contiguous()
    with torch.cuda.device(device):
        alias = torch.as_tensor(CudaArray(host.data_ptr(), tuple(host.shape), host.element_size()), device=device)
    return alias.view(host.dtype)
