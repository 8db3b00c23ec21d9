"""ModelRunner: scheduled chunks → a ForwardBatch in static buffers → model → logits;
and `HostResult`, a step's sampled tensors on their way to the host."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from edgemoe.engine.batch_buffers import BatchBuffers, SeqChunk
from edgemoe.engine.sampler import SampleOutput
from edgemoe.layers.attention_backend import AttentionBackend
from edgemoe.layers.batch import ForwardBatch
from edgemoe.layers.context import StepContext
from edgemoe.models.transformer import CausalLM
from edgemoe.moe.synthetic_routing import SyntheticRouting
from edgemoe.profiling import DISABLED, StepProfiler


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        attention: AttentionBackend,
        buffers: BatchBuffers,
        profiler: StepProfiler = DISABLED,
        routing: SyntheticRouting | None = None,
    ) -> None:
        self.model, self.attention, self.buffers, self.profiler = model, attention, buffers, profiler
        self.routing = routing  # cache studies: the step's expert ids, drawn before the forward

    def forward(self, chunks: Sequence[SeqChunk]) -> tuple[ForwardBatch, torch.Tensor]:
        """Run one step's chunks; return the batch and float32 logits [N, V] for its
        logits rows. Nothing here reads the device back."""
        batch = self.buffers.build(chunks)
        self.attention.prepare(batch)
        if self.routing is not None:
            host = batch.host
            self.routing.prepare(host.q_lens, host.seq_lens, host.req_rows)
        hidden = self.model.forward(StepContext(batch, self.attention, self.profiler))
        with self.profiler.region("lm_head"):
            return batch, self.model.logits(hidden)


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or not t.is_cuda:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


@dataclass
class HostResult:
    """A step's sampled ids and logprobs, copied to pinned host memory asynchronously;
    `wait()` is the step's one host synchronisation."""

    output: SampleOutput  # host tensors (once waited for)
    ready: torch.cuda.Event | None

    @classmethod
    def start(cls, out: SampleOutput) -> HostResult:
        top = out.top_logprobs
        host = SampleOutput(
            _to_host(out.token_ids),  # type: ignore[arg-type]
            _to_host(out.logprobs),
            None if top is None else type(top)(_to_host(top.ids), _to_host(top.values)),  # type: ignore[arg-type]
        )
        event = None
        if out.token_ids.is_cuda:
            event = torch.cuda.Event()
            event.record()
        return cls(host, event)

    def wait(self) -> SampleOutput:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        return self.output
