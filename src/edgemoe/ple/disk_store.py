"""`--ple-store disk`: PLE tables in files, each step's rows read by a filler thread into
pinned staging rows ahead of the step, then copied to a fixed device buffer the PLE
layers read (so a CUDA graph replays over it).

A *fill* is one chunk's rows (every PLE layer, every hash head, every token), keyed by
the chunk's tokens and its n-gram context, hashed on the host (`kernels/ngram_hash.py`
on CPU tensors). Fills are submitted by `prefetch` (decode: the moment the sampled token
reaches the host; prefill: the chunk after the one just launched) or, at the latest, by
`begin_step`, which waits for each of the step's fills and copies its rows.

NOTE (the invariants the regression tests hold it to):
- each fill has its own staging rows and its own completion event (`threading.Event`);
  a step copies only the fills of its own chunks, after each one's event;
- a fill that failed raises `PleFillError` in the step that needed it (its rows are never
  copied), and its rows are freed; other fills are unaffected;
- staging rows return to the allocator only after the device finished copying them (a
  CUDA event, recorded and queried on the engine thread) or, for a fill nobody used,
  after the filler is done with it; the filler only reads files into rows it was given.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from edgemoe.kernels.ngram_hash import ngram_ids, ngram_shifts
from edgemoe.ple.geometry import PleGeometry
from edgemoe.ple.staging import EventPool, RangeAllocator
from edgemoe.ple.store import PleFillError, PleStore, StepChunk
from edgemoe.ple.table_files import RowReader

log = logging.getLogger(__name__)

ReadFn = Callable[[int, np.ndarray, np.ndarray], None]  # (table j, rows [n], out [n, row_nbytes] uint8)
Key = tuple[tuple[int, ...], tuple[int, ...]]  # (n-gram context, tokens)
READ_BATCH = 512  # rows per reader task


@dataclass(eq=False)
class Fill:
    key: Key
    start: int  # first staging row
    n: int  # tokens
    ids: np.ndarray  # [L, n, heads] table rows
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    copied: torch.cuda.Event | None = None  # the device copy out of its rows (engine thread)


class DiskStore(PleStore):
    hashes_on_device = False

    def __init__(
        self, geometry: PleGeometry, readers: Sequence[RowReader] | ReadFn, device: torch.device, dtype: torch.dtype,
        max_tokens: int, threads: int = 16, staging_tokens: int | None = None,
    ) -> None:
        super().__init__(geometry)
        g = geometry
        self.device, self.dtype, self.cuda = device, dtype, device.type == "cuda"
        self.width = g.embed_dim  # elements per token per layer
        self.readers = list(readers) if not callable(readers) else []
        self.read: ReadFn = readers if callable(readers) else self._read_file
        L = len(g.layers)
        cap = staging_tokens or 4 * max_tokens
        self.staging = torch.zeros((cap, L, self.width), dtype=dtype, pin_memory=self.cuda)
        self.rows = RangeAllocator(cap)
        self.step_rows = torch.zeros((max_tokens, L, self.width), dtype=dtype, device=device)
        self.events = EventPool() if self.cuda else None
        self.pending: dict[Key, Fill] = {}  # submitted, not yet claimed by a step
        self.retiring: list[Fill] = []  # copied or abandoned: rows free once the device / filler is done
        self.wait_seconds = 0.0  # time begin_step spent waiting for fills (stats)
        self.bytes_read = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="edgemoe-ple-read")
        self._queue: queue.SimpleQueue[Fill | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="edgemoe-ple-fill", daemon=True)
        self._thread.start()

    # -- engine thread -----------------------------------------------------------------

    def prefetch(self, chunks: Sequence[StepChunk]) -> None:
        """Start fills for chunks a coming step will compute (skipped when staging is full)."""
        for c in chunks:
            key = self.key(c)
            if key not in self.pending and len(key[1]) <= self.step_rows.shape[0]:
                fill = self._submit(key, wait=False)
                if fill is not None:
                    self.pending[key] = fill

    def begin_step(self, chunks: Sequence[StepChunk]) -> None:
        keys = [self.key(c) for c in chunks]
        claimed = {k: f for k in dict.fromkeys(keys) if (f := self.pending.pop(k, None)) is not None}
        self._abandon_unclaimed()  # before submitting: their rows may be what this step needs
        fills: dict[Key, Fill] = {}
        for key in dict.fromkeys(keys):  # one fill per distinct chunk (padding repeats one)
            fill = claimed.get(key) or self._submit(key, wait=True)
            assert fill is not None
            fills[key] = fill
        t0 = time.perf_counter()
        failed = None
        for fill in fills.values():
            fill.done.wait()
            failed = failed or fill.error
        self.wait_seconds += time.perf_counter() - t0
        if failed is not None:
            self.retiring.extend(fills.values())  # filler done with all: freed below, never copied
            self._collect()
            raise PleFillError(f"reading PLE rows from {self._where()} failed: {failed}") from failed
        offset = 0
        for key in keys:  # NOTE: each chunk's rows come from its own fill, in batch order
            fill = fills[key]
            self.step_rows[offset : offset + fill.n].copy_(self.staging[fill.start : fill.start + fill.n],
                                                             non_blocking=self.cuda)
            offset += fill.n
        for fill in fills.values():
            fill.copied = self.events.record() if self.events is not None else None
            self.retiring.append(fill)

    def gather(self, j: int, ids: torch.Tensor | None, num_tokens: int) -> torch.Tensor:
        """Rows the step's `begin_step` copied (a fixed buffer: a captured graph reads it too)."""
        return self.step_rows[:num_tokens, j].view(num_tokens, self.geometry.heads, self.geometry.head_dim)

    def key(self, c: StepChunk) -> Key:
        C, eos = self.geometry.context, self.geometry.eos
        ctx = tuple(c.context)[-C:] if C else ()
        return (eos,) * (C - len(ctx)) + ctx, tuple(c.token_ids)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)
        for r in self.readers:
            r.close()

    def _submit(self, key: Key, wait: bool) -> Fill | None:
        n = len(key[1])
        start = self._alloc(n, wait)
        if start is None:
            return None
        fill = Fill(key, start, n, self.host_ids(key))
        self._queue.put(fill)
        return fill

    def host_ids(self, key: Key) -> np.ndarray:
        """[L, n, heads] table rows of a chunk: the device hashing, on host tensors."""
        g, (ctx, tokens) = self.geometry, key
        shifted = ngram_shifts(
            torch.tensor(tokens, dtype=torch.int64), torch.tensor([0, len(tokens)], dtype=torch.int32),
            torch.tensor([ctx], dtype=torch.int64).view(1, -1), torch.zeros(1, dtype=torch.int32),
            torch.ones(1, dtype=torch.bool), g.ngram_size, g.eos,
        )
        mult = torch.tensor([x.multipliers for x in g.layers], dtype=torch.int64)
        vocab = torch.tensor([x.vocab_sizes for x in g.layers], dtype=torch.int64)
        offs = torch.tensor([x.offsets for x in g.layers], dtype=torch.int64)
        return ngram_ids(shifted, mult, vocab, offs, g.heads_per_ngram).numpy()

    def _alloc(self, n: int, wait: bool) -> int | None:
        self._collect()
        start = self.rows.alloc(n)
        while start is None and wait and self.retiring:
            self._collect(block=True)
            start = self.rows.alloc(n)
        if start is None and wait:
            raise PleFillError(f"a chunk of {n} tokens does not fit the {self.rows.capacity}-token PLE staging")
        return start

    def _collect(self, block: bool = False) -> None:
        """Free the rows of retiring fills whose device copy (or filler) is done; `block`:
        wait for the oldest one first."""
        if block and self.retiring:
            oldest = self.retiring[0]
            oldest.done.wait()
            if oldest.copied is not None:
                oldest.copied.synchronize()
        keep = []
        for fill in self.retiring:
            if fill.done.is_set() and (fill.copied is None or fill.copied.query()):
                self.rows.free(fill.start, fill.n)
                if fill.copied is not None and self.events is not None:
                    self.events.recycle(fill.copied)
            else:
                keep.append(fill)
        self.retiring = keep

    def _abandon_unclaimed(self) -> None:
        """Prefetched fills this step did not use (the chunk changed, the request ended)."""
        self.retiring.extend(self.pending.values())
        self.pending.clear()

    def _where(self) -> str:
        return str(self.readers[0].path.parent) if self.readers else "the PLE store"

    # -- filler thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            fill = self._queue.get()
            if fill is None:
                return
            try:
                self._fill(fill)
            except BaseException as e:  # noqa: BLE001 - handed to the step that needs the rows
                fill.error = e
            finally:
                fill.done.set()

    def _fill(self, fill: Fill) -> None:
        """Read every row of the fill into its staging rows (reader threads, in batches)."""
        g = self.geometry
        row_bytes = g.row_nbytes(self.dtype.itemsize)
        stage = self.staging[fill.start : fill.start + fill.n].view(torch.uint8).numpy()  # [n, L, heads·row_bytes]
        tasks = []
        for j in range(len(g.layers)):
            rows = fill.ids[j].reshape(-1)  # [n · heads]: token-major, then head
            out = stage[:, j].reshape(fill.n, g.heads, row_bytes)  # a view: the last dim split
            for lo in range(0, rows.size, READ_BATCH):
                tasks.append(self._pool.submit(self._read_into, j, rows[lo : lo + READ_BATCH], out, lo))
        for t in tasks:
            t.result()  # re-raises a reader's error
        self.bytes_read += fill.ids.size * row_bytes

    def _read_into(self, j: int, rows: np.ndarray, out: np.ndarray, lo: int) -> None:
        """Rows lo .. of the fill's flat (token, head) order into out [n, heads, row_bytes]."""
        buf = np.empty((rows.size, out.shape[2]), dtype=np.uint8)
        self.read(j, rows, buf)
        flat = np.arange(lo, lo + rows.size)
        out[flat // out.shape[1], flat % out.shape[1]] = buf

    def _read_file(self, j: int, rows: np.ndarray, out: np.ndarray) -> None:
        self.readers[j].read(rows, out)
