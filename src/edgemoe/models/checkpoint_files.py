"""A checkpoint directory's files: which safetensors files hold which tensors (the
index, or the files themselves), every name confined to the directory, and the JSON
files read with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from safetensors import safe_open


class CheckpointError(ValueError):
    """The checkpoint directory is incomplete or inconsistent; the message names the file."""


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def safetensors_files(model_dir: Path) -> dict[str, list[str]]:
    """File name → tensor names it should hold (from the index when sharded).

    Every file must lie inside `model_dir` (see `confined`): a checkpoint's index is
    data from whoever published it, and must not make the loader open other files.
    """
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        files: dict[str, list[str]] = {}
        for name, fname in weight_map.items():
            files.setdefault(confined(model_dir, fname, index.name), []).append(name)
        for fname in files:
            if not (model_dir / fname).exists():
                raise CheckpointError(f"{model_dir / fname}: listed in {index.name} but missing")
        return files
    single = model_dir / "model.safetensors"
    found = [single] if single.exists() else sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{model_dir}: no model.safetensors, index or *.safetensors files")
    return {confined(model_dir, p.name, "the directory"): [] for p in found}


def confined(model_dir: Path, fname: object, listed_in: str) -> str:
    """`fname` if it names a regular file inside `model_dir`, else CheckpointError naming it.

    Refused: non-strings, absolute paths and `..` parts (an index could otherwise make us
    read any file), and names resolving to something that is not a regular file (a
    device or a FIFO could hang the loader). A symlink the user placed in their own
    model directory (models kept on another disk, the Hub cache's snapshot → blob
    links) is followed: the directory's owner chose it.
    """
    where = f"{model_dir}: {listed_in} names"
    if not isinstance(fname, str) or not fname.strip():
        raise CheckpointError(f"{where} {fname!r}, which is not a file name")
    parts = PurePosixPath(fname.replace("\\", "/"))
    if parts.is_absolute() or PureWindowsPath(fname).is_absolute() or ".." in parts.parts:
        raise CheckpointError(f"{where} {fname!r}, outside the model directory")
    target = (model_dir / fname).resolve()
    if target.exists() and not target.is_file():
        raise CheckpointError(f"{where} {fname!r}, which resolves to {target}, not a regular file")
    return fname


def all_names(model_dir: Path, files: dict[str, list[str]]) -> list[str]:
    """Every tensor name of the checkpoint: the index's, or each file's header."""
    listed = [n for ns in files.values() for n in ns]
    if listed:
        return listed
    out: list[str] = []
    for fname in files:
        try:
            with safe_open(str(model_dir / fname), framework="pt") as handle:
                out.extend(handle.keys())
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{model_dir / fname}: corrupt or truncated safetensors file ({e})") from None
    return out
