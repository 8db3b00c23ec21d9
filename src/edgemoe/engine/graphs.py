"""Decode steps from CUDA graphs: one graph per padded batch size.

A decode batch (every sequence adds one token) is padded up to the next captured size
with entries that point at the page table's scratch row and the KV pool's scratch page
(they compute garbage nobody reads), its metadata written into the static batch
buffers, and the captured forward (embedding → layers → LM head) replayed: one launch
for the whole step. Padding is the same whether or not graphs run (`--no-cuda-graph`
pads and runs eagerly), so graphs on and off give bitwise the same tokens.

Only what is capture-safe is captured: the attention backend must say `graph_safe`,
and the MoE executor must never read back from the device (resident experts; offload
II brings the expert cache inside). Sampling stays outside (its features change per
step) and is a handful of kernels.

An executor with graph variants (`MoEExecutor.graph_variants`: the device cache's CPU
share on and off, decode prefetch on and off) has every size captured once per variant;
a replay takes the variant the executor names at that step.

Every graph writes its fp32 logits into one static buffer of the largest size (the LM
head's cast to fp32 is the copy into it), allocated outside the graphs' pool: the captures
keep one [max_bs, V] buffer alive, not one per size and variant (53 MB a variant at
max_bs 32 for Qwen3's vocabulary, ×4 with four variants). Replays never run concurrently
and each step's sampling is queued before the next replay, so one buffer serves every
size.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from edgemoe.engine.batch_buffers import BatchBuffers, SeqChunk
from edgemoe.layers.batch import ForwardBatch

log = logging.getLogger(__name__)

# (batch, out) → logits [N, V] fp32, written into `out` when given; device work only
ForwardFn = Callable[[ForwardBatch, "torch.Tensor | None"], torch.Tensor]


class GraphVariants(Protocol):
    """What switches a forward between captured variants (`MoEExecutor` has these)."""

    graph_variants: tuple[str | None, ...]
    graph_variant: str | None

    def use_graph_variant(self, variant: str | None) -> None: ...


class OneVariant:
    """No variants: one capture a size."""

    graph_variants: tuple[str | None, ...] = (None,)
    graph_variant: str | None = None

    def use_graph_variant(self, variant: str | None) -> None:
        assert variant is None


def graph_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_bs (and max_bs itself)."""
    sizes = [s for s in (1, 2, 4) if s < max_bs] + list(range(8, max_bs, 8))
    return sorted({*sizes, max_bs})


class DecodePadding:
    """Pads decode batches to fixed sizes with scratch entries."""

    def __init__(self, sizes: Sequence[int], scratch_row: int, scratch_page: int) -> None:
        self.sizes = sorted(sizes)
        self.scratch_row, self.scratch_page = scratch_row, scratch_page

    def size_for(self, n: int) -> int | None:
        """The padded size of an n-sequence decode batch; None above the largest size."""
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def pad(self, chunks: Sequence[SeqChunk], size: int) -> list[SeqChunk]:
        filler = SeqChunk(self.scratch_row, 0, (0,), (self.scratch_page,), in_prompt=False, wants_logits=True)
        return list(chunks) + [filler] * (size - len(chunks))


def trim(batch: ForwardBatch, n: int) -> ForwardBatch:
    """The batch as the first n (real) sequences see it: sampling rows and logits rows."""
    return dataclasses.replace(batch, sample_rows=batch.sample_rows[:n], logits_indices=batch.logits_indices[:n])


class DecodeGraphs:
    """Captured forwards by (padded batch size, variant), replayed on the static batch buffers."""

    def __init__(self, forward: ForwardFn, buffers: BatchBuffers, padding: DecodePadding,
                 variants: GraphVariants | None = None) -> None:
        self.forward, self.buffers, self.padding = forward, buffers, padding
        self.variants = variants or OneVariant()
        self.graphs: dict[tuple[int, str | None], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.logits_out: torch.Tensor | None = None  # [max size, V] fp32: every graph's logits

    def capture(self) -> float:
        """Capture every size of every variant (largest first, so the shared memory pool is
        sized once); returns the seconds it took. The executor's variant is restored."""
        t0 = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()
        # NOTE: one warm-up stream for every capture: the caching allocator keeps freed blocks
        # per stream, so a stream per capture strands each one's warm-up blocks (a 2 GiB cap
        # ran out of memory capturing a second variant that way).
        side = torch.cuda.Stream()
        current = self.variants.graph_variant
        try:
            for variant in self.variants.graph_variants:
                self.variants.use_graph_variant(variant)
                for size in reversed(self.padding.sizes):
                    self.graphs[(size, variant)] = self._capture(size, side)
        finally:
            self.variants.use_graph_variant(current)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _capture(self, size: int, side: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        batch = self.buffers.build(self.padding.pad([], size))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: allocations and autotuning, off the graph
            for _ in range(2):
                logits = self.forward(batch, None)
        torch.cuda.current_stream().wait_stream(side)
        if self.logits_out is None:  # at the first (largest) size; outside the pool
            self.logits_out = logits.new_empty((self.padding.sizes[-1], logits.shape[-1]))
        del logits  # the warm-up's, back to the allocator before the capture
        graph = torch.cuda.CUDAGraph()
        out = self.logits_out[:size]
        with torch.cuda.graph(graph, pool=self.pool):
            self.forward(batch, out)
        return graph, out

    def replay(self, chunks: Sequence[SeqChunk], size: int) -> tuple[ForwardBatch, torch.Tensor]:
        batch = self.buffers.build(self.padding.pad(chunks, size))
        graph, logits = self.graphs[(size, self.variants.graph_variant)]
        graph.replay()
        return trim(batch, len(chunks)), logits[: len(chunks)]
