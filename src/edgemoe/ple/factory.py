"""Choosing and building the PLE store (`--ple-store`, `--ple-dir`).

- device: the tables in device memory (on a machine without a GPU: RAM, where the model runs);
- host: pinned host RAM, gathered by a device kernel over mapped memory (`host_store.py`);
- disk: files under `--ple-dir` (default `<cache dir>/ple/<model digest>`), written from
  the checkpoint or the preset on first use, read by a filler thread (`disk_store.py`);
- auto: device when the tables take at most a quarter of the device budget (always on the
  CPU), else host when they fit half of the host memory available, else disk.

The loader writes each table straight where the store keeps it (`table_alloc`): a device
tensor, a host tensor (page-locked in place afterwards), or a mapped file.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from edgemoe.models.loader import TableAlloc
from edgemoe.moe.pinning import Registrar
from edgemoe.ple.disk_store import DiskStore
from edgemoe.ple.geometry import PleGeometry
from edgemoe.ple.host_store import HostStore
from edgemoe.ple.store import DeviceStore, PleStore
from edgemoe.ple.table_files import TableFiles

log = logging.getLogger(__name__)

KINDS = ("auto", "device", "host", "disk")


def resolve_kind(setting: str, table_bytes: int, device: torch.device, device_budget: int | None,
                 host_available: int) -> str:
    if setting not in KINDS:
        raise ValueError(f"ple_store (--ple-store) {setting!r}: choose one of {', '.join(KINDS)}")
    if setting != "auto":
        return setting
    if device.type != "cuda" or (device_budget is not None and table_bytes <= device_budget // 4):
        return "device"
    return "host" if table_bytes <= host_available // 2 else "disk"


def default_dir(cache: Path, identity: str) -> Path:
    return cache / "ple" / hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()


@dataclass
class PlePlan:
    """Where the tables go, decided before loading; `alloc` for the loader, `store()` after it."""

    kind: str
    geometry: PleGeometry
    device: torch.device
    dtype: torch.dtype
    files: TableFiles | None = None

    @property
    def alloc(self) -> TableAlloc:
        if self.files is not None:
            return self.files.alloc
        where = self.device if self.kind == "device" else torch.device("cpu")

        def alloc(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=where)

        return alloc

    def store(self, tables: dict[str, torch.Tensor], max_tokens: int, registrar: Registrar | None) -> PleStore:
        """The store over the loaded `tables` (by our name `ple.<j>`; none for disk files)."""
        g = self.geometry
        ordered = [tables.get(f"ple.{j}") for j in range(len(g.layers))]
        if self.kind == "disk":
            assert self.files is not None
            self.files.finish()  # what the loader wrote is complete now
            readers = self.files.readers()
            if readers and not readers[0].direct:
                log.warning("--ple-store disk: the page cache holds what is read (no O_DIRECT here)")
            return DiskStore(g, readers, self.device, self.dtype, max_tokens)
        if any(t is None for t in ordered):
            raise ValueError("the loader did not produce every PLE table")
        if self.kind == "device":
            return DeviceStore(g, [t.to(self.device) for t in ordered])  # type: ignore[union-attr]
        return HostStore(g, ordered, self.device, registrar)  # type: ignore[arg-type]


def plan_ple(kind: str, geometry: PleGeometry, device: torch.device, dtype: torch.dtype, ple_dir: Path | None,
             identity: str, cache: Path) -> PlePlan:
    files = None
    if kind == "disk":
        root = ple_dir or default_dir(cache, f"{identity}|{dtype}")
        files = TableFiles(root, geometry, dtype, f"{identity}|{dtype}")
        log.warning("PLE tables on disk under %s (%.2f GiB)", root, geometry.table_nbytes(dtype.itemsize) / 2**30)
    return PlePlan(kind, geometry, device, dtype, files)
