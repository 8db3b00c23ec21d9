"""`DecodeGraphs`' bookkeeping on the CPU: CUDA's graph API replaced by a recorder (a capture
records the forward it ran, a replay runs it again over the static batch buffers, as a
CUDA graph replays its kernels over fixed addresses). Checked: every size and variant writes
one static logits buffer, a replay's logits are the eager forward's for the batch staged at
that step whatever size ran before, and a replay takes the executor's variant."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

from edgemoe.cache.page_table import PageTable
from edgemoe.engine.batch_buffers import BatchBuffers, SeqChunk
from edgemoe.engine.graphs import DecodeGraphs, DecodePadding
from edgemoe.layers.batch import ForwardBatch

VOCAB = 37


class RecordedGraph:
    """A capture's work, replayed by running it again."""

    def __init__(self) -> None:
        self.work: list[Callable[[], None]] = []

    def replay(self) -> None:
        for work in self.work:
            work()


class FakeCuda:
    """The slice of `torch.cuda` that `DecodeGraphs` uses, on the CPU."""

    def __init__(self) -> None:
        self.capturing: RecordedGraph | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        stream = type("Stream", (), {"wait_stream": lambda self, other: None})
        for name, value in {
            "graph_pool_handle": lambda: object(), "Stream": stream, "current_stream": stream,
            "stream": lambda s: contextlib.nullcontext(), "synchronize": lambda: None,
            "CUDAGraph": RecordedGraph, "graph": self.graph,
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)

    @contextlib.contextmanager
    def graph(self, graph: RecordedGraph, pool: object = None) -> Iterator[None]:
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None


class Variants:
    graph_variants = (None, "other")
    graph_variant: str | None = None

    def use_graph_variant(self, variant: str | None) -> None:
        self.graph_variant = variant


def logits_of(batch: ForwardBatch, variant: str | None) -> torch.Tensor:
    """Logits that tell rows, ids, positions and the variant apart."""
    rows = batch.logits_indices
    ids, pos = batch.input_ids[rows], batch.positions[rows]
    base = torch.arange(VOCAB, dtype=torch.float32)
    return base * ids[:, None].float() + pos[:, None].float() + (0.5 if variant else 0.0)


def recording_forward(cuda: FakeCuda, variants: Variants) -> Callable[..., torch.Tensor]:
    def forward(batch: ForwardBatch, out: torch.Tensor | None) -> torch.Tensor:
        variant = variants.graph_variant

        def work() -> torch.Tensor:
            logits = logits_of(batch, variant)
            return logits if out is None else out.copy_(logits)

        if cuda.capturing is not None:
            cuda.capturing.work.append(work)
        return work()

    return forward


def decode_chunks(table: PageTable, n: int, step: int) -> list[SeqChunk]:
    return [SeqChunk(row, 3 + step, [100 + 7 * row + step], [row], in_prompt=False, wants_logits=True)
            for row in range(n)]


def test_every_size_and_variant_writes_one_logits_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    table = PageTable(8, 4, torch.device("cpu"))
    for row in range(4):
        table.assign()
        table.write(row, 0, [row])
    buffers = BatchBuffers(16, 8, table, 16)
    padding = DecodePadding([1, 2, 4], table.scratch_row, 0)
    variants = Variants()
    graphs = DecodeGraphs(recording_forward(cuda, variants), buffers, padding, variants)
    graphs.capture()
    assert sorted(graphs.graphs, key=str) == sorted(((s, v) for s in (1, 2, 4) for v in (None, "other")), key=str)
    assert graphs.logits_out is not None and graphs.logits_out.shape == (4, VOCAB)
    base = graphs.logits_out.untyped_storage().data_ptr()
    assert {out.untyped_storage().data_ptr() for _, out in graphs.graphs.values()} == {base}
    # a batch shrinking through the sizes, the variant switching: each replay is its step's eager logits
    for step, (n, variant) in enumerate([(4, None), (3, "other"), (2, None), (1, "other"), (4, "other")]):
        variants.use_graph_variant(variant)
        chunks = decode_chunks(table, n, step)
        batch, logits = graphs.replay(chunks, padding.size_for(n))
        eager = buffers.build(padding.pad(chunks, padding.size_for(n)))
        torch.testing.assert_close(logits, logits_of(eager, variant)[:n], rtol=0, atol=0)
        assert batch.sample_rows.numel() == n


def test_the_lm_head_casts_into_the_graphs_buffer(qwen3_ckpt) -> None:  # noqa: ANN001
    from edgemoe import LLM

    with LLM(str(qwen3_ckpt), dtype="bfloat16") as llm:
        model = llm.engine.runner.model
        hidden = torch.randn(3, model.lm_head.shape[1], generator=torch.Generator().manual_seed(0)).bfloat16()
        out = torch.full((4, model.lm_head.shape[0]), float("nan"))
        written = model.logits(hidden, out[:3])
        assert written.data_ptr() == out.data_ptr() and written.dtype == torch.float32
        assert torch.equal(out[:3], model.logits(hidden)) and out[3].isnan().all()
