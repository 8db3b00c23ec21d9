"""An expert store that serves experts straight from the checkpoint's safetensors files.

For hosts with less RAM than the model: nothing is copied at load time; each expert
tensor is a zero-copy view into a private (copy-on-write) memory map of its file, and
the OS page cache keeps the hot ones in RAM. Copies to the device come from pageable
memory, so they are slower than from the pinned BankStore.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

from edgemoe.moe.store import ExpertStore

ST_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
    "F8_E4M3": torch.float8_e4m3fn, "I8": torch.int8, "U8": torch.uint8,
}


class SafetensorsMap:
    """One file's header and a read-only-in-practice memory map of its bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
            self.data_start = 8 + n
            # ACCESS_COPY: private pages, so torch.frombuffer gets a writable buffer
            # without any write ever reaching the file.
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)

    def view(self, name: str) -> torch.Tensor:
        info = self.header[name]
        dtype = ST_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = (end - begin) // dtype.itemsize
        flat = torch.frombuffer(self.map, dtype=dtype, count=count, offset=self.data_start + begin)
        return flat.view(info["shape"])


class MmapStore(ExpertStore):
    """Experts as views into the checkpoint; gate/up/down kept separate as on disk."""

    def __init__(self, layers: list[int], num_experts: int, hidden: int, inter: int, dtype: torch.dtype) -> None:
        self.layers, self.num_experts, self.dtype = sorted(layers), num_experts, dtype
        self.gate_up_shape, self.down_shape = (2 * inter, hidden), (hidden, inter)
        self._maps: dict[Path, SafetensorsMap] = {}
        self._parts: dict[tuple[int, int, str], torch.Tensor] = {}

    def file(self, path: Path) -> SafetensorsMap:
        if path not in self._maps:
            self._maps[path] = SafetensorsMap(path)
        return self._maps[path]

    def expected_shape(self, part: str) -> tuple[int, ...]:
        return self.down_shape if part == "down" else (self.gate_up_shape[0] // 2, self.gate_up_shape[1])

    def add(self, layer: int, expert: int, part: str, tensor: torch.Tensor) -> None:
        """Register one on-disk tensor: part is "gate", "up" or "down"."""
        self._parts[(layer, expert, part)] = tensor

    def missing(self) -> list[tuple[int, int, str]]:
        return [
            (layer, e, part)
            for layer in self.layers
            for e in range(self.num_experts)
            for part in ("gate", "up", "down")
            if (layer, e, part) not in self._parts
        ]

    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self._parts
        gate_up = torch.cat([p[(layer, e, "gate")], p[(layer, e, "up")]]).to(self.dtype)
        return gate_up, p[(layer, e, "down")].to(self.dtype)
