"""Step profiling: named regions timed with CUDA events, resolved lazily.

`StepProfiler` is long-lived and shared by the runner, the layers and the MoE
executors; it costs nothing while disabled (`region()` returns one shared null
context). Enabled (by `edgemoe bench decode --profile`), each region records a pair of
CUDA events on the current stream around its work (host wall-clock on the CPU);
`step_end()` closes a step, and `resolve()` turns the recorded events into
milliseconds per region per step without synchronising inside a step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

_NULL = contextlib.nullcontext()


@dataclass
class _Step:
    events: list[tuple[str, object, object]] = field(default_factory=list)
    host_s: dict[str, float] = field(default_factory=dict)  # regions timed on the host
    start: object | None = None
    end: object | None = None
    wall_s: float = 0.0


class StepProfiler:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.enabled = False
        self._steps: list[_Step] = []
        self._current: _Step | None = None
        self._t0 = 0.0

    def _event(self) -> object:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def step_begin(self) -> None:
        if not self.enabled:
            return
        self._current = _Step()
        self._current.start = self._event()
        self._t0 = time.perf_counter()

    def step_end(self) -> None:
        if not self.enabled or self._current is None:
            return
        self._current.end = self._event()
        self._current.wall_s = time.perf_counter() - self._t0
        self._steps.append(self._current)
        self._current = None

    def region(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time the device work issued inside the block as region `name`."""
        if not self.enabled or self._current is None:
            return _NULL
        return self._timed(name)

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        start = self._event()
        yield
        if self._current is not None:
            self._current.events.append((name, start, self._event()))

    def add_host_time(self, name: str, seconds: float) -> None:
        """Work done on host threads (CPU experts): wall-clock seconds."""
        if self.enabled and self._current is not None:
            self._current.host_s[name] = self._current.host_s.get(name, 0.0) + seconds

    def resolve(self) -> list[dict[str, float]]:
        """Milliseconds per region per finished step (synchronises once), then forget them.
        Keys: each region (a name with "/" is a part of the region before it, e.g.
        "moe/copy"), `device_ms` (the step's span on the device), `wall_ms` (host time
        from step_begin to step_end), `gap_ms` (span − top-level regions: the device
        idle, waiting for the host, or running unlabelled work)."""
        if self.cuda and self._steps:
            torch.cuda.synchronize()
        out = [self._resolve_step(s) for s in self._steps]
        self._steps.clear()
        return out

    def _elapsed_ms(self, a: object, b: object) -> float:
        if self.cuda:
            return a.elapsed_time(b)  # type: ignore[attr-defined]
        return 1000 * (b - a)  # type: ignore[operator]

    def _resolve_step(self, s: _Step) -> dict[str, float]:
        row: dict[str, float] = {}
        for name, a, b in s.events:
            row[name] = row.get(name, 0.0) + self._elapsed_ms(a, b)
        for name, seconds in s.host_s.items():
            row[name] = row.get(name, 0.0) + 1000 * seconds
        top = sum(v for k, v in row.items() if "/" not in k)
        row["device_ms"] = self._elapsed_ms(s.start, s.end)
        row["wall_ms"] = 1000 * s.wall_s
        row["gap_ms"] = max(0.0, row["device_ms"] - top)
        return row


# A disabled profiler for collaborators built without one (tests, tools).
DISABLED = StepProfiler(torch.device("cpu"))
