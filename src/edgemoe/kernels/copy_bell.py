"""The copier: the device cache's misses (a decode layer's own, `--expert-mover copy`, and
decode prefetch's) moved by the GPU's copy engine from inside a captured graph (issue 13,
item 1: the copy engine in the real step). `kernels/cpu/em_copier.h`
says the protocol: a launch of the graph publishes a miss list in a page-locked row and
rings it; a C thread (no Python, no GIL) issues one `cuMemcpyHtoDAsync` per miss and part on
a stream of its own, then `cuStreamWriteValue32` of the row's done word behind them; the
graph's stream waits for that word (`cuStreamWaitValue32`, a node of the graph) before the
layer computes. The graph stays one graph: nothing in it holds an expert's address.

Against the device gather (`moe/movers.GatherMover` on a side stream): the copy engine takes
no SMs from the GEMVs running beside it, and it reads pinned memory at the link's rate on
hosts where SMs reading mapped memory do not (33 against 48.8 GB/s on an H100 host of
2026-12-07). The price is the thread's hop, a few µs, hidden a prefetch's depth ahead.

`publish` (`triton_ops/copy_ring.py` on CUDA, `publish_ref` elsewhere) is the device's part;
without a GPU the driver's functions are the library's host stand-ins (a memcpy and a store:
the CPU tests drive the whole protocol so).
"""

from __future__ import annotations

import ctypes
import time

import torch

from edgemoe.env_switch import env_whole
from edgemoe.kernels.backend import triton_importable
from edgemoe.kernels.cpu_bell import host_spin, libcuda, stream_wait

HEADER = 2  # a row's ints before its ids: the store table's layer, unused


def _address(fn: object) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _driver_functions(device: torch.device) -> tuple[int, int, int, int]:
    """(copy, write, set context, context): the driver's `cuMemcpyHtoDAsync`,
    `cuStreamWriteValue32`, `cuCtxSetCurrent` and `device`'s current context (the driver the
    bell loaded: `copier_for` checked its stream memory operations)."""
    lib = libcuda()
    if lib is None:
        raise RuntimeError("copier: no CUDA driver with stream memory operations")
    lib.cuCtxGetCurrent.restype, lib.cuCtxGetCurrent.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p)]
    torch.cuda.init()
    with torch.cuda.device(device):
        torch.cuda.current_stream(device).synchronize()  # the primary context made current here
        ctx = ctypes.c_void_p()
        if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
            raise RuntimeError("copier: no current CUDA context")
    copy = getattr(lib, "cuMemcpyHtoDAsync_v2", None) or lib.cuMemcpyHtoDAsync
    write = getattr(lib, "cuStreamWriteValue32_v2", None) or lib.cuStreamWriteValue32
    return _address(copy), _address(write), _address(lib.cuCtxSetCurrent), ctx.value


def spin_us() -> int:
    """`EDGEMOE_COPIER_SPIN_US`: how long the thread spins after a ring before it polls (0,
    the default: polls every 5 µs; a spinning thread takes a core the CPU share's pool may
    need). The A/B's knob."""
    return env_whole("EDGEMOE_COPIER_SPIN_US", 0, "microseconds")


def copier_library() -> ctypes.CDLL | None:
    """The CPU expert library this machine loads (its copier is in every variant), or None
    where none builds (no C compiler: the device gather moves the prefetch's copies)."""
    from edgemoe.kernels import cpu_build
    from edgemoe.kernels.cpu_kernel import _auto_kernel

    variant = _auto_kernel()
    return None if variant == "torch" else cpu_build.load(variant)


def publish_ref(misses: torch.Tensor, layer: int, row: torch.Tensor, flag: torch.Tensor, done: torch.Tensor) -> None:
    """The device's part in torch (the CPU path and the reference): `done` cleared, `row`
    [HEADER + 2W] = the table layer, 0, the miss list's ids then slots (`misses` [2, M],
    M ≤ W; the rest -1), then `flag` set. In this order: the thread acts on the flag."""
    width = (row.numel() - HEADER) // 2
    m = misses.shape[1]
    done.zero_()
    row[0], row[1] = layer, 0
    row[HEADER:].fill_(-1)
    row[HEADER:HEADER + m] = misses[0]
    row[HEADER + width:HEADER + width + m] = misses[1]
    flag.fill_(1)


def publish(misses: torch.Tensor, layer: int, row: torch.Tensor, flag: torch.Tensor, done: torch.Tensor) -> None:
    """`publish_ref`'s values; on CUDA one launch whose flag store is released at system
    scope after the row's (what the thread reads once it sees the flag)."""
    if misses.is_cuda and triton_importable():
        from edgemoe.kernels.triton_ops.copy_ring import publish_triton

        publish_triton(misses, layer, row, flag, done)
        return
    publish_ref(misses, layer, row, flag, done)


def _bank(bank: torch.Tensor, like: torch.Tensor) -> list[int]:
    """[base address, bytes from one expert (or slot) to the next] of `bank` [N, ...], whose
    rows are contiguous and as long as `like`'s (what one copy moves)."""
    if not bank[0].is_contiguous() or bank[0].nbytes != like[0].nbytes:
        raise ValueError(f"copier: a bank's rows must be contiguous and {like[0].nbytes} bytes (got {bank.shape}, "
                         f"{bank.dtype}, strides {bank.stride()})")
    return [bank.data_ptr(), bank.stride(0) * bank.element_size()]


class CopyBell:
    """The thread over `rows` rows of up to `width` misses each, copying expert e of store
    layer `layers[i]` into slot s of every part: `sources[i][part]` the host bank [E, ...]
    (page-locked on a GPU), `slots[part]` the slot bank [S, ...]. `device` None: the host
    plays the device (tests; the slot banks are host tensors). `urgent`: a row the thread
    looks at first (a decode layer's own misses), or None."""

    def __init__(self, lib: ctypes.CDLL, layers: list[int], sources: list[dict[str, torch.Tensor]],
                 slots: dict[str, torch.Tensor], rows: int, width: int, device: torch.device | None,
                 urgent: int | None = None) -> None:
        cuda = device is not None and device.type == "cuda"
        self.device, self.width, self._lib = device, width, lib
        self.table = {layer: i for i, layer in enumerate(layers)}
        names = list(slots)
        self._flags = torch.zeros(rows, dtype=torch.int32, pin_memory=cuda)
        self._rows = torch.full((rows, HEADER + 2 * width), -1, dtype=torch.int32, pin_memory=cuda)
        self._src = torch.tensor([[_bank(src[n], slots[n]) for n in names] for src in sources], dtype=torch.int64)
        self._dst = torch.tensor([[*_bank(slots[n], slots[n]), slots[n][0].nbytes] for n in names], dtype=torch.int64)
        self.done = torch.zeros(rows, dtype=torch.int32, device=device if cuda else "cpu")
        self._done_at = torch.tensor([self.done.data_ptr() + 4 * r for r in range(rows)], dtype=torch.int64)
        if cuda:
            from edgemoe.moe.pinning import uva_view

            self.flags, self.rows = uva_view(self._flags, device), uva_view(self._rows, device)
            self.stream = torch.cuda.Stream(device)  # NOTE: torch's streams don't sync with the legacy default
            copy, write, set_ctx, ctx = _driver_functions(device)
            stream = self.stream.cuda_stream
        else:
            self.flags, self.rows, self.stream = self._flags, self._rows, None
            copy, write = _address(lib.em_copier_test_copy), _address(lib.em_copier_test_write)
            set_ctx, ctx, stream = 0, 0, 0
        E, S = next(iter(sources[0].values())).shape[0], next(iter(slots.values())).shape[0]
        self._handle = lib.em_copier_start(copy, write, set_ctx or None, ctx or None, stream or None,
                                           self._flags.data_ptr(), self._rows.data_ptr(), rows, width,
                                           self._src.data_ptr(), len(sources), len(names), self._dst.data_ptr(),
                                           self._done_at.data_ptr(), E, S, -1 if urgent is None else urgent,
                                           spin_us() * 1000)
        if not self._handle:
            raise RuntimeError("copier: the thread did not start (its CUDA context refused)")
        self._keep = (sources, slots)  # NOTE: the thread reads these banks' memory until close()

    def ring(self, row: int, layer: int, misses: torch.Tensor) -> None:
        """On the current stream, after its earlier work: copy `misses` [2, M] (ids, slots;
        -1 padded) of store layer `layer` through row `row`."""
        publish(misses, self.table[layer], self.rows[row], self.flags[row:row + 1], self.done[row:row + 1])

    def wait(self, row: int) -> None:
        """The current stream (a GPU) or this thread (the host) waits for row `row`'s copies."""
        if self.done.is_cuda:
            stream_wait(torch.cuda.current_stream(self.device), self._done_at[row].item(), 1)
        else:
            host_spin(self.done[row:row + 1], 1, 10.0, f"copier row {row}")

    def drain(self, timeout_s: float = 10.0) -> None:
        """Once the rings issued so far are answered: every copy landed (after a failed
        step; the host waits)."""
        if not self._handle:
            return
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the rings published
        deadline = time.monotonic() + timeout_s
        while bool(self._flags.any()) or self._lib.em_copier_busy(self._handle):
            if time.monotonic() > deadline:
                raise TimeoutError("copier: rings not taken")
            time.sleep(1e-4)
        self._check()
        if self.stream is not None:
            self.stream.synchronize()

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_int64 * 6)()
        if self._handle:
            self._lib.em_copier_stats(self._handle, out)
        return dict(zip(("rings", "copies", "bytes", "busy_ns", "errors", "last_error"), out, strict=True))

    def host_view(self) -> dict[str, object]:
        """What the host can read of the thread without the device (a hung graph's diagnosis):
        its counts, each row's flag (rung, not taken), whether it is inside a ring (a driver
        call), and each row's head (the table layer, then ids)."""
        inside = bool(self._lib.em_copier_busy(self._handle)) if self._handle else None
        return {"copier": self.stats(), "flags": self._flags.tolist(), "inside_a_ring": inside,
                "rows": [row[:6] for row in self._rows.tolist()]}

    def _check(self) -> None:
        stats = self.stats()
        if stats["errors"]:
            raise RuntimeError(f"copier: {stats['errors']} rows failed (last CUresult {stats['last_error']})")

    def close(self) -> None:
        if self._handle:
            self._lib.em_copier_stop(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
