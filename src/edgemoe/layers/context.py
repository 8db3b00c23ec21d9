"""StepContext: the per-step state a forward pass reads, passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass

from edgemoe.layers.attention_backend import AttentionBackend
from edgemoe.layers.batch import ForwardBatch
from edgemoe.profiling import DISABLED, StepProfiler


@dataclass(frozen=True)
class StepContext:
    batch: ForwardBatch
    attention: AttentionBackend  # prepared for `batch`
    profiler: StepProfiler = DISABLED
