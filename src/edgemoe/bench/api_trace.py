"""Counting what a step asks of the CUDA runtime: kernel launches and host syncs.

`count_api_calls(fn)` runs `fn` under torch.profiler and counts the runtime calls that
launch work and those that make the host wait for the device. Used by
`edgemoe bench decode --profile` and by the GPU tests that hold the hot path to its
budget of host synchronisations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")
# Calls after which the host has waited for the device (a plain cudaMemcpy is synchronous).
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


class ApiCounts(NamedTuple):
    launches: int
    syncs: int
    graph_launches: int
    by_name: dict[str, int]  # every runtime call seen, for the JSON


def _trace(fn: Callable[[], object]) -> Counter[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return Counter(e.name for e in prof.events() if e.name.startswith(("cuda", "cu")))


def count_api_calls(fn: Callable[[], object]) -> ApiCounts:
    """Run `fn` once under the profiler; count its CUDA runtime calls, less what tracing
    an empty function records (our trailing synchronize, the profiler's own calls)."""
    names = _trace(fn)
    names.subtract(_trace(lambda: None))
    return ApiCounts(
        launches=sum(names[n] for n in LAUNCHES),
        syncs=sum(names[n] for n in SYNCS),
        graph_launches=names["cudaGraphLaunch"],
        by_name={k: v for k, v in sorted(names.items()) if v > 0},
    )
