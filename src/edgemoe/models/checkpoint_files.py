"""A checkpoint directory's files: which safetensors files hold which tensors (the
index, or the files themselves), every name confined to the directory, and the JSON
files read with errors that name the file."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, TypeVar

import torch
from safetensors import safe_open

log = logging.getLogger(__name__)
Arch = TypeVar("Arch")
LM_HEAD = "lm_head.weight"  # every family's LM head name (multimodal ones too)


class CheckpointError(ValueError):
    """The checkpoint directory is incomplete or inconsistent; the message names the file."""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path` (config.json, the index), CheckpointError naming the file."""
    # NOTE: a FIFO would block the read forever, a directory or a symlink loop raise OSError.
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path}: not a regular file")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def safetensors_files(model_dir: Path) -> dict[str, list[str]]:
    """File name → tensor names it should hold (from the index when sharded).

    Every file must lie inside `model_dir` (see `confined`): a checkpoint's index is
    data from whoever published it, and must not make the loader open other files.
    """
    index = model_dir / "model.safetensors.index.json"
    if index.exists() or index.is_symlink():  # a broken link is reported, not read as no index
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


def with_stored_lm_head(arch: Arch, model_dir: Path) -> Arch:
    """`arch` untied when its config ties the LM head to the embedding but the checkpoint
    also stores `lm_head.weight`. NOTE: transformers then ties only if the two hold equal
    values and otherwise warns and uses the stored head; reading it whenever it is stored
    gives the same model either way (one more vocab x hidden tensor when equal)."""
    if not getattr(arch, "tie_word_embeddings", False):
        return arch
    try:
        stored = LM_HEAD in all_names(model_dir, safetensors_files(model_dir))
    except CheckpointError:
        return arch  # the loader reports a broken directory, naming the file
    if not stored:
        return arch
    log.warning("%s: config.json ties the LM head to the embedding (tie_word_embeddings) but the checkpoint "
                "stores %s: using the stored head, as transformers does", model_dir, LM_HEAD)
    return dataclasses.replace(arch, tie_word_embeddings=False)  # type: ignore[type-var]


FLOAT_DTYPES = ("BF16", "F16", "F32")  # safetensors' names


def all_float(model_dir: Path, files: dict[str, list[str]], names: set[str]) -> bool:
    """Whether every tensor of `names` the checkpoint holds is stored in a float dtype (and
    it holds some), from the files' headers alone: nothing is read."""
    seen = False
    for fname in files:
        try:
            with safe_open(str(model_dir / fname), framework="pt") as handle:
                for name in names.intersection(handle.keys()):
                    if handle.get_slice(name).get_dtype() not in FLOAT_DTYPES:
                        return False
                    seen = True
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{model_dir / fname}: corrupt or truncated safetensors file ({e})") from None
    return seen


def check_plain(path: Path, name: str, tensor: torch.Tensor) -> None:
    """A tensor placed as stored must be a plain float one: fp8 / integer ones need their scales."""
    if not tensor.is_floating_point() or tensor.element_size() == 1:
        raise CheckpointError(f"{path}: tensor {name!r} is stored as {tensor.dtype}, which config.json's "
                              "quantization_config (absent, or another method's) does not decode")
