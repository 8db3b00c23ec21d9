"""ModelRunner: scheduled chunks → a ForwardBatch in static buffers → model → logits
(decode batches padded and, when possible, replayed from CUDA graphs); and
`HostResult`, a step's sampled tensors on their way to the host."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from edgemoe.env_switch import env_switch
from edgemoe.cache.state_pool import StatePool
from edgemoe.engine.batch_buffers import BatchBuffers, SeqChunk, all_decode
from edgemoe.engine.graphs import DecodeGraphs, DecodePadding, GraphVariants, trim
from edgemoe.engine.sampler import SampleOutput
from edgemoe.layers.attention_backend import AttentionBackend
from edgemoe.layers.batch import BatchMode, ForwardBatch
from edgemoe.layers.context import StateStep, StepContext
from edgemoe.models.transformer import CausalLM
from edgemoe.moe.synthetic_routing import SyntheticRouting
from edgemoe.ple.store import PleStore
from edgemoe.profiling import DISABLED, StepProfiler


class MoEStepHooks(GraphVariants, Protocol):
    """The MoE executor as the runner drives it between steps (`MoEExecutor`)."""

    quiet_eager: bool  # an eager step waits for the step before it (`MoEExecutor`'s note)

    def before_step(self, now: float, decode_batch: int | None, prompt_rows: int = 0) -> None: ...


class ModelRunner:
    """Contract: `forward(chunks)` returns (batch, logits [N, V] fp32) for the chunks'
    logits rows, launching device work only. With `padding`, a batch of decode chunks
    is padded to a fixed size (and replayed from `graphs` when they were captured):
    the returned batch and logits cover the real chunks only. `count_tokens(n)` hears
    each step's real token count (expert statistics). `states` (hybrid models): the GDN
    state rows each step's `StateStep` names (padded entries: the scratch row, from zeros).
    `ple` (Qwen3.8-Flash-Next): the PLE store hears each step's chunks, padding included,
    before the batch runs (a disk store copies the step's rows then; a failed read raises
    `PleFillError` here, before any of the step's device work). `routing` (cache studies)
    draws the step's expert ids for its real chunks before the forward or the replay and
    stages them in its static device buffer (padding draws nothing, so the draws are the
    same padded or not, graphs or not). `live_rows` hears, inside
    each forward (so a captured graph replays it), which rows are real
    (`MoEExecutor.set_live_rows`). `moe` (the executor) hears each step's start on the
    host, before the forward or replay (`before_step`: it may tune itself and switch its
    graph variant), and has each variant captured (`engine/graphs.py`). With overlap, a
    decode chunk's PENDING id is read on the device from `buffers.last_token` (inside the
    graphs too)."""

    def __init__(
        self,
        model: CausalLM,
        attention: AttentionBackend,
        buffers: BatchBuffers,
        profiler: StepProfiler = DISABLED,
        padding: DecodePadding | None = None,
        count_tokens: Callable[[int], None] = lambda n: None,
        routing: SyntheticRouting | None = None,
        states: StatePool | None = None,
        ple: PleStore | None = None,
        live_rows: Callable[[torch.Tensor | None], None] = lambda live: None,
        moe: MoEStepHooks | None = None,
    ) -> None:
        self.model, self.attention, self.buffers, self.profiler = model, attention, buffers, profiler
        self.ple, self.live_rows, self.moe = ple, live_rows, moe
        self.padding, self.count_tokens, self.states = padding, count_tokens, states
        self.graphs: DecodeGraphs | None = None
        self.routing = routing  # cache studies: the step's expert ids, staged before the forward

    def capture_graphs(self) -> float:
        """Capture the decode sizes of `padding` (seconds taken)."""
        assert self.padding is not None and (self.routing is None or self.routing.graph_safe)
        self.graphs = DecodeGraphs(self.run_batch, self.buffers, self.padding, self.moe)
        return self.graphs.capture()

    def forward(self, chunks: Sequence[SeqChunk]) -> tuple[ForwardBatch, torch.Tensor]:
        """Run one step's chunks. Nothing here reads the device back."""
        decode = all_decode(chunks)
        size = self.padding.size_for(len(chunks)) if decode and self.padding is not None else None
        padded = chunks if size is None else self.padding.pad(chunks, size)  # type: ignore[union-attr]
        if self.ple is not None:
            with self.profiler.region("ple_wait"):
                self.ple.begin_step(padded)
        self.count_tokens(sum(len(c.token_ids) for c in chunks))
        if self.moe is not None:  # before the replay: it may switch the variant to replay
            prompt_rows = 0 if decode else sum(len(c.token_ids) for c in chunks if c.in_prompt)
            self.moe.before_step(time.perf_counter(), len(chunks) if decode else None, prompt_rows)
        if self.routing is not None:  # outside run_batch: a replay must find its ids staged
            self.routing.prepare([len(c.token_ids) for c in chunks], [c.start + len(c.token_ids) for c in chunks],
                                 [c.row for c in chunks], size)
        if size is not None and self.graphs is not None:
            with self.profiler.region("graph"):
                return self.graphs.replay(chunks, size)
        if self.moe is not None and self.moe.quiet_eager:  # NOTE: a host wait, not a read
            torch.cuda.current_stream().synchronize()
        if size is None:
            batch = self.buffers.build(chunks)
            return batch, self.run_batch(batch)
        batch = self.buffers.build(padded)
        return trim(batch, len(chunks)), self.run_batch(batch)[: len(chunks)]

    def prefetch(self, chunks: Sequence[SeqChunk]) -> None:
        """Chunks a coming step will compute (a disk PLE store starts reading their rows)."""
        if self.ple is not None:
            self.ple.prefetch(chunks)

    def run_batch(self, batch: ForwardBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        """The forward of a built batch: logits [N, V] fp32 for its logits rows (written into
        `out` when given: the decode graphs' static buffer)."""
        self.buffers.fetch_pending(batch)  # overlap: decode ids the step in flight sampled
        self.attention.prepare(batch)
        self.live_rows(self._live_rows(batch))
        state = StateStep.prepare(self.states, batch) if self.states is not None else None
        hidden = self.model.forward(StepContext(batch, self.attention, self.profiler, state))
        with self.profiler.region("lm_head"):
            return self.model.logits(hidden, out)

    def _live_rows(self, batch: ForwardBatch) -> torch.Tensor | None:
        """[T] bool on the device: the real rows of a padded decode batch (one token per
        sequence; padding names the scratch row). Device work: captured with the step.
        NOTE: a batch of one keeps its mask although a replay's one row is always real: the
        graph is captured on a filler row, whose routing must not touch the expert cache,
        and the host's padding count is frozen at capture, so only the mask, read from the
        static buffers, can tell the capture (padding) from the replays (live)."""
        if self.padding is None or batch.mode is not BatchMode.DECODE:
            return None
        return batch.req_rows != self.padding.scratch_row


def blocking_wait() -> bool:
    """`EDGEMOE_BLOCKING_WAIT=1`: the engine thread sleeps on a step's result instead of
    spinning (CUDA's default for a process with fewer contexts than cores), freeing its
    core. Why it may matter: with the hybrid CPU share every core is busy — this thread's
    spin, the bell thread and the C pool's workers (Qwen3.8 on 16 cores:
    docs/benchmarks.md) — so any other thread takes a core from a worker. With overlap the
    wake-up's latency (tens of µs) is hidden behind the next step; without it, it adds to
    every step. Off: measured on the GPU machine (docs/benchmarks.md "Pinned CPU workers")
    it gained nothing once the C pool's workers were pinned. Read at each step, so one
    engine can A/B it (`gpu_qwen4_bench.py --alternate-env`)."""
    return env_switch("EDGEMOE_BLOCKING_WAIT", False)


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
            event = torch.cuda.Event(blocking=blocking_wait())
            event.record()
        return cls(host, event)

    def wait(self) -> SampleOutput:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        return self.output
