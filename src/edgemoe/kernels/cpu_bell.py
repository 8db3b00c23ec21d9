"""The CPU share's bell: a C thread that runs a layer's mailbox when the device rings, in
place of a host node (`kernels/cpu/em_host.h` says the protocol).

A decode step's layer rings and awaits it from inside its launches (`BellTurn`: the share's
launch publishes the ring once the mailbox is written, the combine spins until the layer is
done, `triton_ops/host_words.py`): no node between two launches, so programmatic
dependent launch runs through the hand-off. Elsewhere (prompt chunks, the torch path) the
ring and the wait are stream memory operations (`cuStreamWriteValue32` after the mailbox
writes, `cuStreamWaitValue32` before the CPU's cells are read back), which a CUDA graph
captures as memory-operation nodes: no driver callback thread, no events, no side stream.
The two words live in page-locked host memory the device reaches through its mapping.
`bell_supported` probes the driver once (the operations, and their capture in a graph);
`EDGEMOE_CPU_BELL=0` keeps the host node.

Each ring first clears `done`, so a layer never reads its own previous step's answer (a
model with one MoE layer rings the same value every step).

`CpuBell.ring_host` / `wait_host` do the device's part from the host: the CPU tests drive
the thread with them.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
from typing import NamedTuple

import torch

from edgemoe.env_switch import env_switch
from edgemoe.kernels.cpu_host_layer import HostLayerMailboxes

log = logging.getLogger(__name__)

WAIT_EQ = 0x1  # CU_STREAM_WAIT_VALUE_EQ
LINE = 16  # int32 words between ring and done: separate 64-byte cache lines


@functools.cache
def libcuda() -> ctypes.CDLL | None:
    """The driver API's stream memory operations, or None (no libcuda, or too old)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name in ("cuStreamWriteValue32", "cuStreamWaitValue32"):
        fn = getattr(lib, f"{name}_v2", None) or getattr(lib, name, None)
        if fn is None:
            return None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        setattr(lib, f"em_{name}", fn)
    return lib


def _memop(name: str, stream: torch.cuda.Stream, addr: int, value: int, flags: int) -> None:
    """`cuStreamWriteValue32` / `cuStreamWaitValue32` (`name`) on `stream`."""
    rc = getattr(libcuda(), f"em_{name}")(ctypes.c_void_p(stream.cuda_stream), addr, value, flags)
    if rc != 0:
        raise RuntimeError(f"{name} failed (CUresult {rc})")


def _write(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    _memop("cuStreamWriteValue32", stream, addr, value, 0)


def stream_wait(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    _memop("cuStreamWaitValue32", stream, addr, value, WAIT_EQ)


def _words(device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int32 words a cache line apart (page-locked when a GPU uses them), and their
    device-visible view (the words themselves without a GPU)."""
    words = torch.zeros(2 * LINE, dtype=torch.int32, pin_memory=device is not None and device.type == "cuda")
    if device is None or device.type != "cuda":
        return words, words
    from edgemoe.moe.pinning import uva_view

    return words, uva_view(words, device)


class BellTurn(NamedTuple):
    """One layer's turn at the bell, as kernels ring and await it: `ring` and `done` [1]
    int32 (device-visible views of the words), `value` the layer's (its mailbox row + 1).
    A launch clears `done`, writes the mailbox and publishes `value` in `ring`; a later
    launch spins until `done` holds `value` (`triton_ops/host_words.py`)."""

    ring: torch.Tensor
    done: torch.Tensor
    value: int


def await_turn(turn: BellTurn) -> None:
    """Wait for `turn`'s answer outside a kernel: on a GPU the current stream waits (a
    stream memory operation), on the host this thread spins."""
    if turn.done.is_cuda:
        stream_wait(torch.cuda.current_stream(turn.done.device), turn.done.data_ptr(), turn.value)
        return
    host_spin(turn.done, turn.value, 10.0)


def host_spin(word: torch.Tensor, value: int, timeout_s: float, what: str = "the CPU share's bell") -> None:
    """On the host: until the int32 `word` (a host tensor) holds `value` (`what` waits, for the error)."""
    deadline = time.monotonic() + timeout_s
    while int(word.view(-1)[0]) != value:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: value {value} not done in {timeout_s} s")


def bell_wanted() -> bool:
    return env_switch("EDGEMOE_CPU_BELL", True)


def quiet_wanted() -> bool:
    """`EDGEMOE_BELL_QUIET=0` keeps the bell polling every 20 µs for a second after each
    burst even where the host expects no ring (the A/B's arm: `CpuBell.set_quiet`)."""
    return env_switch("EDGEMOE_BELL_QUIET", True)


@functools.cache
def bell_supported(device_index: int) -> bool:
    """Whether the driver runs stream memory operations on host words, captured in a graph
    (one probe a process and device; logged when not)."""
    if libcuda() is None:
        log.warning("CPU share: no stream memory operations in the driver: the host node hands off")
        return False
    device = torch.device("cuda", device_index)
    words, view = _words(device)
    stream = torch.cuda.Stream(device)
    try:
        with torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                _write(stream, view.data_ptr(), 7)
                stream_wait(stream, view.data_ptr(), 7)
            graph.replay()
        stream.synchronize()
        ok = int(words[0]) == 7
    except RuntimeError as e:
        log.warning("CPU share: stream memory operations unusable here (%s): the host node hands off", e)
        return False
    return ok


class CpuBell:
    """The thread over `mailboxes` (its rows), and the two words. `device` None: the host
    plays the device (tests)."""

    def __init__(self, mailboxes: HostLayerMailboxes, device: torch.device | None) -> None:
        self.mailboxes = mailboxes
        self.words, view = _words(device)
        self._ring, self._done = view[0:1], view[LINE:LINE + 1]  # what the kernels write and read
        host = self.words.data_ptr()
        lib = mailboxes.kernel.lib
        assert lib is not None
        table = mailboxes.table
        self._lib = lib
        self._handle = lib.em_bell_start(host, host + LINE * 4, table.data_ptr(), table.stride(0) * 8, table.shape[0])
        if not self._handle:
            raise RuntimeError("CPU share: the bell thread did not start")

    def row(self, layer: int) -> int:
        return self.mailboxes.layer_row[layer]

    def turn(self, layer: int) -> BellTurn:
        """`layer`'s turn, for kernels that ring and await it themselves."""
        return BellTurn(self._ring, self._done, self.row(layer) + 1)

    def ring(self, stream: torch.cuda.Stream, layer: int) -> None:
        """On `stream`, after its earlier work: run `layer`'s mailbox on the CPU (`done`
        cleared first: see the module)."""
        turn = self.turn(layer)
        _write(stream, turn.done.data_ptr(), 0)
        _write(stream, turn.ring.data_ptr(), turn.value)

    def ring_host(self, layer: int) -> None:
        """`ring` from the host: `done` cleared first, as the device does."""
        self.words[LINE] = 0
        self.words[0] = self.row(layer) + 1

    def wait_host(self, layer: int, timeout_s: float = 10.0) -> None:
        host_spin(self.words[LINE:LINE + 1], self.row(layer) + 1, timeout_s)

    def set_quiet(self, quiet: bool) -> None:
        """Whether the host expects no ring for a while: the thread then polls every 500 µs
        once its spin ends, not every 20 µs (`em_host.h`); a ring is answered either way."""
        if self._handle:
            self._lib.em_bell_quiet(self._handle, int(quiet))

    def close(self) -> None:
        if self._handle:
            self._lib.em_bell_stop(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
