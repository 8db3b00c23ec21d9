"""An expert store that serves experts straight from the checkpoint's safetensors files.

For hosts with less RAM than the model: nothing is copied at load time; each expert
tensor is a zero-copy view into a private (copy-on-write) memory map of its file, and
the OS page cache keeps the hot ones in RAM. Copies to the device come from pageable
memory, so they are slower than from the pinned BankStore.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path

import torch

from edgemoe.moe.store import ExpertStore

ST_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
    "F8_E4M3": torch.float8_e4m3fn, "I8": torch.int8, "U8": torch.uint8,
}


# Bytes per element of every safetensors dtype (the format's own table); a header is
# checked against it even for dtypes we cannot view.
ST_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
# The safetensors library's limit on the JSON header (100 MB).
MAX_HEADER_BYTES = 100_000_000


class SafetensorsMap:
    """One file's header and a read-only-in-practice memory map of its bytes.

    The header is validated as the `safetensors` library does before any view is made:
    each tensor's offsets lie in the data section, match its shape and dtype, and the
    tensors tile the data section exactly (no gaps, no overlaps). ValueError otherwise.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ValueError(f"{path}: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"{path}: header length {n} exceeds the file ({size} bytes) or 100 MB")
            try:
                self.header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{path}: header is not valid JSON ({e})") from None
            self.data_start = 8 + n
            validate_header(self.header, size - self.data_start, path)
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


def validate_header(header: object, data_bytes: int, path: Path | str = "") -> None:
    """Raise ValueError (naming the file and tensor) unless `header` describes tensors
    that exactly tile a data section of `data_bytes` bytes."""
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = _entry_span(info, f"{path}: tensor {name!r}")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            what = "overlaps the previous tensor" if begin < at else f"leaves a gap at byte {at}"
            raise ValueError(f"{path}: tensor {name!r} at data_offsets [{begin}, {end}] {what}")
        at = end
    if at != data_bytes:
        raise ValueError(f"{path}: the tensors cover {at} bytes of a {data_bytes}-byte data section")


def _entry_span(info: object, where: str) -> tuple[int, int]:
    """One header entry's [begin, end), checked against its dtype and shape."""
    if not isinstance(info, dict):
        raise ValueError(f"{where}: entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ST_ITEMSIZE:
        raise ValueError(f"{where}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        raise ValueError(f"{where}: data_offsets {offsets!r} are not two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise ValueError(f"{where}: data_offsets [{begin}, {end}] end before they begin")
    nbytes = math.prod(shape) * ST_ITEMSIZE[dtype]
    if end - begin != nbytes:
        raise ValueError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
                         f"its shape {shape} of {dtype} needs {nbytes}")
    return begin, end


def _natural(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


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
