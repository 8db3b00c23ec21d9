"""`cudaLaunchHostFunc` through ctypes, from the CUDA runtime torch already loaded.

A host function launched on a stream runs on a driver thread once the stream's earlier
work is done, and the stream's later work waits for it. While the stream is captured,
the launch records a host node: the graph runs the function at that point of every
replay. The function must be C (`void fn(void *)`, no CUDA calls, no Python): ours is
`em_host_layer` (`kernels/cpu/em_host.h`).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from pathlib import Path

import torch


def _loaded_cudart() -> list[str]:
    """Paths of the libcudart this process has mapped (torch's), from /proc/self/maps."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if "libcudart" in line and "/" in line})


@functools.cache
def cudart() -> ctypes.CDLL:
    """The CUDA runtime torch uses (the mapped one first: one runtime in the process),
    else a libcudart beside torch's libraries or on the loader's path."""
    torch.cuda.init()  # torch loads its runtime now, if it hasn't
    torch_lib = Path(torch.__file__).parent / "lib"
    site = Path(torch.__file__).parent.parent / "nvidia"
    loaded = _loaded_cudart()  # /proc/self/maps, read once
    candidates = [*loaded, *sorted(glob.glob(str(torch_lib / "libcudart*.so*"))),
                  *sorted(glob.glob(str(site / "*" / "lib" / "libcudart.so*"))), "libcudart.so.13", "libcudart.so.12",
                  "libcudart.so"]
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL) if path in loaded \
                else ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        if hasattr(lib, "cudaLaunchHostFunc"):
            lib.cudaLaunchHostFunc.restype = ctypes.c_int
            lib.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            return lib
    raise RuntimeError("no CUDA runtime with cudaLaunchHostFunc: " + "; ".join(errors or ["none found"]))


def launch_host_func(stream: torch.cuda.Stream, fn: int, user_data: int) -> None:
    """Run C function `fn(user_data)` on `stream` (recorded as a host node while capturing)."""
    rc = cudart().cudaLaunchHostFunc(ctypes.c_void_p(stream.cuda_stream), ctypes.c_void_p(fn),
                                     ctypes.c_void_p(user_data))
    if rc != 0:
        raise RuntimeError(f"cudaLaunchHostFunc failed (cudaError {rc})")
