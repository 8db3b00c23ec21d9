"""The PLE stores on a machine without a GPU: the disk store's rows against the in-memory
table (O_DIRECT and the page-cache fallback, rows straddling aligned blocks), and the
filler's contract — a step submitted while an earlier fill is still pending neither
deadlocks nor reads another fill's rows, and a failed fill fails exactly the step that
needed it, after which the store serves on with nothing leaked."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from edgemoe.ple.disk_store import DiskStore
from edgemoe.ple.geometry import ple_geometry
from edgemoe.ple.store import PleFillError
from edgemoe.ple.table_files import RowReader, TableFiles

EOS, VOCAB = 5, 300
TIMEOUT = 20  # seconds: a wait this long is a deadlock


@dataclass(frozen=True)
class Chunk:
    start: int
    token_ids: tuple[int, ...]
    context: tuple[int, ...] = ()


def geometry(head_dim: int):  # noqa: ANN201
    heads = 4
    return ple_geometry(ple_layers=(0, 2), vocab_size=VOCAB, ngram_size=3, heads_per_ngram=2, embed_dim=heads * head_dim,
                        vocab_base=1000, divisor=128, seed=1234, split_parts=4, eos=EOS)


def write_tables(root: Path, g, dtype: torch.dtype = torch.float32) -> tuple[TableFiles, list[torch.Tensor]]:  # noqa: ANN001
    files = TableFiles(root, g, dtype, "test-model")
    tables = []
    for j, layer in enumerate(g.layers):
        t = torch.randn((layer.rows, g.head_dim), generator=torch.Generator().manual_seed(j)).to(dtype)
        dest = files.alloc(f"ple.{j}", (layer.rows, g.head_dim), dtype)
        assert dest is not None
        dest.copy_(t)
        tables.append(t)
    files.finish()
    return files, tables


def expected(store: DiskStore, tables: list[torch.Tensor], chunks: list[Chunk]) -> torch.Tensor:
    """[T, L, heads · d]: each chunk's rows read straight from the in-memory tables."""
    per_chunk = []
    for c in chunks:
        ids = torch.from_numpy(store.host_ids(store.key(c)))  # [L, n, heads]
        per_chunk.append(torch.stack([t[ids[j]].flatten(1) for j, t in enumerate(tables)], dim=1))
    return torch.cat(per_chunk)


def step(store: DiskStore, chunks: list[Chunk]) -> torch.Tensor:
    """begin_step with a sentinel in the step rows first: nothing stale can pass."""
    store.step_rows.fill_(float("nan"))
    store.begin_step(chunks)
    T = sum(len(c.token_ids) for c in chunks)
    return torch.stack([store.gather(j, None, T).flatten(1) for j in range(len(store.geometry.layers))], dim=1)


CHUNKS = [Chunk(0, (11, 12, EOS, 13)), Chunk(7, (9,), (40, 41)), Chunk(1, (299, 0, 3), (EOS,))]


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "page_cache"])
@pytest.mark.parametrize("head_dim", [8, 3])  # 32-byte rows, and 12-byte rows that straddle 4 KiB blocks
def test_disk_rows_equal_the_in_memory_table(tmp_path: Path, direct: bool, head_dim: int) -> None:
    g = geometry(head_dim)
    files, tables = write_tables(tmp_path, g)
    readers = files.readers(direct=direct)
    store = DiskStore(g, readers, torch.device("cpu"), torch.float32, max_tokens=16, threads=3)
    try:
        for chunks in (CHUNKS, CHUNKS[1:], [CHUNKS[0], CHUNKS[0]]):  # a repeated chunk: one fill, two copies
            assert torch.equal(step(store, chunks), expected(store, tables, chunks))
        assert TableFiles(tmp_path, g, torch.float32, "test-model").complete(0)
        assert not TableFiles(tmp_path, g, torch.float32, "another-model").complete(0)  # never read by another model
    finally:
        store.close()


class GatedReads:
    """A ReadFn over the in-memory tables whose reads of some rows wait for a gate or fail."""

    def __init__(self, tables: list[torch.Tensor]) -> None:
        self.tables = [t.view(torch.uint8).numpy() for t in tables]
        self.gate, self.hold, self.fail = threading.Event(), set[int](), set[int]()

    def __call__(self, j: int, rows: np.ndarray, out: np.ndarray) -> None:
        if self.hold & set(rows.tolist()):
            assert self.gate.wait(TIMEOUT), "the test never opened the gate"
        if self.fail & set(rows.tolist()):
            raise OSError("injected read failure")
        out[:] = self.tables[j][rows]


def in_thread(fn, *args):  # noqa: ANN001, ANN201
    """fn(*args) on another thread: (thread, result box) so a hang shows as a timeout."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_next_step_submitted_while_a_fill_is_pending(tmp_path: Path) -> None:
    g = geometry(4)
    _, tables = write_tables(tmp_path, g)
    reads = GatedReads(tables)
    store = DiskStore(g, reads, torch.device("cpu"), torch.float32, max_tokens=8, threads=2, staging_tokens=16)
    a, b, c = Chunk(0, (21, 22, 23)), Chunk(3, (24,), (22, 23)), Chunk(0, (30, 31))
    reads.hold = set(store.host_ids(store.key(a))[0].ravel().tolist())  # a's first table waits for the gate
    try:
        store.prefetch([a])  # step N's fill: pending
        store.prefetch([b])  # step N+1's, submitted while N's is still pending
        t, box = in_thread(step, store, [a])
        t.join(0.3)
        assert t.is_alive(), "step N went on without its fill"
        reads.gate.set()
        t.join(TIMEOUT)
        assert not t.is_alive(), "deadlock: step N never got its rows"
        assert torch.equal(box["value"], expected(store, tables, [a]))  # its own rows, not b's
        assert torch.equal(step(store, [b]), expected(store, tables, [b]))  # b's rows, not stale a's
        # A failed fill fails its step, and only its step.
        reads.fail = set(store.host_ids(store.key(c))[1].ravel().tolist())
        store.prefetch([c])
        with pytest.raises(PleFillError, match="injected read failure"):
            step(store, [c])
        reads.fail = set()
        assert torch.equal(step(store, [c, b]), expected(store, tables, [c, b]))  # read again, not stale
        store.begin_step([])  # retire everything
        store._collect(block=True)
        assert store.rows.free_rows == store.rows.capacity and not store.pending, "staging rows leaked"
    finally:
        reads.gate.set()
        store.close()


def test_o_direct_refused_falls_back_with_one_warning(tmp_path: Path, monkeypatch, caplog) -> None:  # noqa: ANN001
    g = geometry(8)
    files, tables = write_tables(tmp_path, g)
    real_open = __import__("os").open

    def refuse(path, flags, *args):  # noqa: ANN001, ANN202
        if flags & getattr(__import__("os"), "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr("edgemoe.ple.table_files.os.open", refuse)
    monkeypatch.setattr(RowReader, "warned", False)
    readers = files.readers(direct=True)
    assert not any(r.direct for r in readers)
    assert sum("O_DIRECT refused" in r.message for r in caplog.records) == 1
    out = np.empty((2, g.row_nbytes(4)), dtype=np.uint8)
    readers[1].read(np.array([3, 1999]), out)
    assert np.array_equal(out, tables[1][[3, 1999]].view(torch.uint8).numpy())
