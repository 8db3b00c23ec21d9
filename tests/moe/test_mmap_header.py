"""The mmap store's safetensors header checks, on handcrafted bad headers.

The oracle is the `safetensors` library itself: every header below that our parser
refuses, `safe_open` refuses too, and the well-formed control is accepted by both.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from edgemoe.moe.mmap_store import SafetensorsMap


def write_raw(path: Path, header: Any, data: bytes, *, header_len: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    n = len(raw) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def good_header() -> dict[str, Any]:
    # a: 2x3 f32 (24 bytes), b: 4 bf16 (8 bytes) -> a 32-byte data section.
    return {"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}


DATA = torch.arange(6, dtype=torch.float32).numpy().tobytes() + torch.ones(4, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()


def library_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_tensor(k)
    except Exception:
        return False
    return True


def test_well_formed_header_views_the_bytes(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "ok.safetensors", good_header(), DATA)
    assert library_accepts(path)
    m = SafetensorsMap(path)
    assert torch.equal(m.view("a"), torch.arange(6, dtype=torch.float32).view(2, 3))
    assert torch.equal(m.view("b"), torch.ones(4, dtype=torch.bfloat16))


def _edit(**entries: Any) -> dict[str, Any]:
    header = good_header()
    for name, info in entries.items():
        header[name] = info
    return header


BAD = {
    "negative offset": (_edit(a={"dtype": "F32", "shape": [2, 3], "data_offsets": [-8, 16]}), DATA, r"'a'.*non-negative"),
    "end before begin": (_edit(b={"dtype": "BF16", "shape": [0], "data_offsets": [32, 24]}), DATA, r"'b'.*end before"),
    "overlap": (_edit(b={"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}), DATA[:24], r"'b'.*overlaps"),
    "gap": (_edit(b={"dtype": "BF16", "shape": [2], "data_offsets": [28, 32]}), DATA, r"'b'.*gap at byte 24"),
    "past the data": (_edit(b={"dtype": "BF16", "shape": [8], "data_offsets": [24, 40]}), DATA, r"cover 40 bytes of a 32"),
    "uncovered tail": (good_header(), DATA + b"\0" * 8, r"cover 32 bytes of a 40"),
    "size is not numel x itemsize": (_edit(b={"dtype": "F32", "shape": [4], "data_offsets": [24, 32]}), DATA, r"'b'.*needs 16"),
    "negative dim": (_edit(b={"dtype": "BF16", "shape": [-4], "data_offsets": [24, 32]}), DATA, r"'b'.*shape"),
    "unknown dtype": (_edit(b={"dtype": "Q3", "shape": [4], "data_offsets": [24, 32]}), DATA, r"'b'.*unknown dtype"),
    "offsets not integers": (_edit(b={"dtype": "BF16", "shape": [4], "data_offsets": [24.0, 32]}), DATA, r"'b'.*data_offsets"),
    "not an object": ([1, 2], DATA, r"not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_header_is_refused_naming_the_tensor(tmp_path: Path, case: str) -> None:
    header, data, pattern = BAD[case]
    path = write_raw(tmp_path / "bad.safetensors", header, data)
    assert not library_accepts(path), "the oracle accepts this header: the case is not bad"
    with pytest.raises(ValueError, match=pattern):
        SafetensorsMap(path)


@pytest.mark.parametrize("header_len", [10**9, 2**63])
def test_header_length_beyond_the_file_is_refused(tmp_path: Path, header_len: int) -> None:
    path = write_raw(tmp_path / "long.safetensors", good_header(), DATA, header_len=header_len)
    assert not library_accepts(path)
    with pytest.raises(ValueError, match="header length"):
        SafetensorsMap(path)


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.safetensors").write_bytes(b"\x01\x00")
    with pytest.raises(ValueError, match="too short"):
        SafetensorsMap(tmp_path / "t.safetensors")
