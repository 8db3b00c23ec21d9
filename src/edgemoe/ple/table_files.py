"""PLE tables as files (`--ple-store disk`): one raw row-major file per table under
`--ple-dir`, written from the checkpoint (or the random preset) on first use, and read
row by row with O_DIRECT so the page cache neither hides the disk nor fills RAM.

`ple.<j>.bin` holds table j's rows (rows × head_dim elements of the model dtype);
`ple.<j>.json` is written once the file is complete: the geometry and the identity of
what wrote it (the checkpoint or the preset), so a later start reuses the files and a
different model never reads them. NOTE: a missing or mismatched marker means the file
is rewritten; a crash mid-write leaves no marker.

O_DIRECT needs the file offset, the length and the buffer aligned to the device's
logical block (`ALIGN` covers 512 and 4096): a row is read as the aligned block(s)
holding it into a page-aligned bounce buffer. Where the filesystem refuses O_DIRECT
(tmpfs, some overlays), reads go through a memory map instead, with one warning.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import threading
from pathlib import Path

import numpy as np
import torch

from edgemoe.ple.geometry import PleGeometry

log = logging.getLogger(__name__)

ALIGN = 4096


class TableFiles:
    """The files of one model's tables: allocation for writing, completion markers, readers."""

    def __init__(self, root: Path, geometry: PleGeometry, dtype: torch.dtype, identity: str) -> None:
        self.root, self.geometry, self.dtype, self.identity = Path(root), geometry, dtype, identity
        self.root.mkdir(parents=True, exist_ok=True)
        self._writing: dict[int, np.memmap] = {}

    def path(self, j: int) -> Path:
        return self.root / f"ple.{j}.bin"

    def _marker(self, j: int) -> dict[str, object]:
        g = self.geometry.layers[j]
        return {"rows": g.rows, "head_dim": self.geometry.head_dim, "dtype": str(self.dtype), "identity": self.identity,
                "vocab_sizes": list(g.vocab_sizes)}

    def complete(self, j: int) -> bool:
        marker = self.root / f"ple.{j}.json"
        try:
            return json.loads(marker.read_text()) == self._marker(j) and self.path(j).stat().st_size == self.nbytes(j)
        except (OSError, ValueError):
            return False

    def nbytes(self, j: int) -> int:
        return self.geometry.layers[j].rows * self.geometry.row_nbytes(self.dtype.itemsize)

    def alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """A loader's `TableAlloc`: a writable map of table `ple.<j>`'s file, or None when a
        complete file is already there (the checkpoint's rows are then not read)."""
        j = int(name.split(".")[1])
        if self.complete(j):
            return None
        (self.root / f"ple.{j}.json").unlink(missing_ok=True)
        raw = np.memmap(self.path(j), dtype=np.uint8, mode="w+", shape=(self.nbytes(j),))
        self._writing[j] = raw
        return torch.from_numpy(raw).view(dtype).view(shape)

    def finish(self) -> None:
        """Flush every file written since the last call and mark it complete."""
        for j, raw in sorted(self._writing.items()):
            raw.flush()
            del raw
            (self.root / f"ple.{j}.json").write_text(json.dumps(self._marker(j)))
        self._writing.clear()

    def readers(self, direct: bool = True) -> list[RowReader]:
        for j in range(len(self.geometry.layers)):
            if not self.complete(j):
                raise FileNotFoundError(f"PLE table file {self.path(j)} is missing or incomplete")
        row = self.geometry.row_nbytes(self.dtype.itemsize)
        return [RowReader(self.path(j), row, direct) for j in range(len(self.geometry.layers))]


class RowReader:
    """Reads rows of one table file: O_DIRECT with aligned bounce buffers (one per thread),
    or a memory map where O_DIRECT is refused. Thread-safe."""

    warned = False

    def __init__(self, path: Path, row_nbytes: int, direct: bool = True) -> None:
        self.path, self.row_nbytes = path, row_nbytes
        self._local = threading.local()
        self.fd, self.direct = -1, False
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                self.direct = True
            except OSError as e:
                self._fallback(e)
        self.map = None if self.direct else np.memmap(path, dtype=np.uint8, mode="r")

    def _fallback(self, why: BaseException) -> None:
        if not RowReader.warned:  # NOTE: once per process: every table sits on the same filesystem
            RowReader.warned = True
            log.warning("PLE tables under %s: O_DIRECT refused (%s); reading through the page cache instead",
                        self.path.parent, why)
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.direct = -1, False
        self.map = np.memmap(self.path, dtype=np.uint8, mode="r")

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """out[i] = the bytes of row rows[i]; out [n, row_nbytes] uint8."""
        if self.direct:
            try:
                self._read_direct(rows, out)
                return
            except OSError as e:  # EINVAL: the filesystem takes the open but not the reads
                self._fallback(e)
        offsets = rows.astype(np.int64)[:, None] * self.row_nbytes + np.arange(self.row_nbytes)
        assert self.map is not None
        out[:] = self.map[offsets]

    def _bounce(self, nbytes: int) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < nbytes:
            buf = mmap.mmap(-1, max(nbytes, 16 * ALIGN))  # anonymous maps are page-aligned
            self._local.buf = buf
        return memoryview(buf)

    def _read_direct(self, rows: np.ndarray, out: np.ndarray) -> None:
        R = self.row_nbytes
        starts = rows.astype(np.int64) * R
        first = starts // ALIGN
        last = (starts + R - 1) // ALIGN
        order = np.argsort(first, kind="stable")
        i = 0
        while i < len(order):  # one aligned read per run of rows starting in the same block
            b0 = int(first[order[i]])
            j = i
            while j < len(order) and first[order[j]] == b0:
                j += 1
            b1 = int(last[order[i:j]].max())
            span = (b1 - b0 + 1) * ALIGN
            view = self._bounce(span)[:span]
            got = os.preadv(self.fd, [view], b0 * ALIGN)
            if got < span and b0 * ALIGN + got < int(starts[order[i:j]].max()) + R:
                raise OSError(f"{self.path}: short read at byte {b0 * ALIGN}")
            block = np.frombuffer(view, dtype=np.uint8)
            for k in order[i:j]:
                lo = int(starts[k] - b0 * ALIGN)
                out[k] = block[lo : lo + R]
            i = j

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
