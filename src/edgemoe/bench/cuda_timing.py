"""Timing GPU kernels the way a decode step runs them: replayed from a CUDA graph.

`graph_us(calls, rounds, replays)`: the calls are run once on a side stream first (Triton
compiles and autotunes there, outside the capture), then captured `rounds` times in order
into one graph, replayed once to settle, then `replays` times between two CUDA events.
Returns the mean µs per call — each call's share includes its ~1 µs in-graph launch, not
the ~10 µs of an eager Python launch. Used by the GPU scripts (scripts/gpu_*.py).

`eager_us(call, reps)`: `call(0)` to warm up, then `call(1)` … `call(reps)` launched eagerly
between two CUDA events; the mean µs per call (copies long enough that launching is hidden:
a call's index picks what it moves, so a pool larger than L2 rotates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def graph_us(calls: Sequence[Callable[[], object]], rounds: int = 1, replays: int = 5) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:  # compile and warm up outside the capture
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for call in calls:
                call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * rounds * len(calls))


def eager_us(call: Callable[[int], object], reps: int) -> float:
    call(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(1, reps + 1):
        call(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / reps
