"""Checkpoint loading: stacking per-expert tensors, and clear errors for bad directories."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from edgemoe.models.arch import ConfigError
from edgemoe.models.loader import CheckpointError, load_checkpoint


@pytest.fixture()
def ckpt(qwen3_ckpt: Path, tmp_path: Path) -> Path:
    """A private copy of the session checkpoint that a test may damage."""
    return Path(shutil.copytree(qwen3_ckpt, tmp_path / "ckpt"))


def _index(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def _rewrite_shard(path: Path, fname: str, edit) -> None:  # noqa: ANN001
    with safe_open(str(path / fname), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors)
    save_file(tensors, str(path / fname), metadata={"format": "pt"})


def test_experts_are_stacked_in_checkpoint_order(qwen3_ckpt: Path) -> None:
    loaded = load_checkpoint(qwen3_ckpt, dtype="float32", progress=False)
    name = "model.layers.1.mlp.experts.3.{}.weight"
    fname = _index(qwen3_ckpt)[name.format("up_proj")]
    with safe_open(str(qwen3_ckpt / fname), framework="pt") as f:
        up = f.get_tensor(name.format("up_proj")).float()
    inter = loaded.arch.moe_intermediate_size
    # a bf16 tensor copied into a float32 bank: exact
    torch.testing.assert_close(loaded.experts.banks[1].gate_up[3, inter:], up, rtol=0, atol=0)


def test_missing_tensor_is_named(ckpt: Path) -> None:
    victim = "model.layers.0.mlp.experts.1.down_proj.weight"
    _rewrite_shard(ckpt, _index(ckpt)[victim], lambda t: t.pop(victim))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.0\.mlp\.experts\.1\.down_proj\.weight'"):
        load_checkpoint(ckpt, progress=False)


def test_shape_mismatch_names_file_and_tensor(ckpt: Path) -> None:
    victim = "model.layers.0.self_attn.o_proj.weight"
    fname = _index(ckpt)[victim]
    _rewrite_shard(ckpt, fname, lambda t: t.__setitem__(victim, t[victim][:, :-1].contiguous()))
    with pytest.raises(CheckpointError, match=rf"{fname}.*{victim}.*shape"):
        load_checkpoint(ckpt, progress=False)


def test_unknown_model_type_lists_supported(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "llama_moe_9000"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"llama_moe_9000.*mixtral, olmoe, qwen3_5_moe, qwen3_5_moe_text, qwen3_moe, qwen3_next"):
        load_checkpoint(ckpt, progress=False)


def test_truncated_safetensors_is_reported(ckpt: Path) -> None:
    fname = sorted(set(_index(ckpt).values()))[0]
    data = (ckpt / fname).read_bytes()
    (ckpt / fname).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{fname}.*(corrupt|truncated)"):
        load_checkpoint(ckpt, progress=False)


def test_garbage_safetensors_is_reported(ckpt: Path) -> None:
    fname = sorted(set(_index(ckpt).values()))[-1]
    (ckpt / fname).write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match=rf"{fname}.*corrupt"):
        load_checkpoint(ckpt, progress=False)


def test_missing_config_and_bad_json(ckpt: Path) -> None:
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        load_checkpoint(ckpt, progress=False)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: file not found"):
        load_checkpoint(ckpt, progress=False)


@pytest.mark.timeout(60)  # a FIFO read blocked forever before the check
@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink loop"])
def test_a_json_file_that_is_no_regular_file_is_named(ckpt: Path, name: str, kind: str) -> None:
    """Each was a raw OSError (IsADirectoryError, ELOOP) or a read that never returned."""
    path = ckpt / name
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(name)
    with pytest.raises(CheckpointError, match=rf"{name}: (not a regular file|cannot read it)"):
        load_checkpoint(ckpt, progress=False)


def test_index_pointing_to_missing_shard(ckpt: Path) -> None:
    fname = sorted(set(_index(ckpt).values()))[0]
    (ckpt / fname).unlink()
    with pytest.raises(CheckpointError, match=rf"{fname}: listed in model.safetensors.index.json but missing"):
        load_checkpoint(ckpt, progress=False)


def test_single_file_checkpoint_loads(ckpt: Path, qwen3_ckpt: Path) -> None:
    tensors = {}
    for fname in sorted(set(_index(ckpt).values())):
        with safe_open(str(ckpt / fname), framework="pt") as f:
            tensors |= {k: f.get_tensor(k) for k in f.keys()}
        (ckpt / fname).unlink()
    (ckpt / "model.safetensors.index.json").unlink()
    save_file(tensors, str(ckpt / "model.safetensors"))
    a = load_checkpoint(ckpt, dtype="float32", progress=False)
    b = load_checkpoint(qwen3_ckpt, dtype="float32", progress=False)
    for k in b.params:
        assert torch.equal(a.params[k], b.params[k]), k


@pytest.mark.parametrize("dtype,expected", [("auto", torch.bfloat16), ("float16", torch.float16), ("float32", torch.float32)])
def test_dtype_choice(qwen3_ckpt: Path, dtype: str, expected: torch.dtype) -> None:
    loaded = load_checkpoint(qwen3_ckpt, dtype=dtype, progress=False)
    assert loaded.params["embed"].dtype == expected
    assert loaded.experts.banks[0].down.dtype == expected


# --------------------------------------------------------------------------- files outside the directory


def _point_index(ckpt: Path, victim_file: str, new_name: str) -> None:
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: (new_name if v == victim_file else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_weight_map_cannot_leave_the_model_directory(ckpt: Path, tmp_path: Path, kind: str) -> None:
    fname = sorted(set(_index(ckpt).values()))[0]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(ckpt / fname, outside / fname)  # a valid shard: only its place is wrong
    target = str(outside / fname) if kind == "absolute" else f"../elsewhere/{fname}"
    _point_index(ckpt, fname, target)
    with pytest.raises(CheckpointError, match=rf"names '{target}'.*outside the model directory"):
        load_checkpoint(ckpt, progress=False)


def test_shard_linked_to_a_regular_file_elsewhere_loads(ckpt: Path, tmp_path: Path) -> None:
    # The directory's owner may keep shards on another disk: a link they made is followed.
    want = load_checkpoint(ckpt, dtype="float32", progress=False)
    fname = sorted(set(_index(ckpt).values()))[0]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(ckpt / fname, outside / fname)
    (ckpt / fname).symlink_to(outside / fname)
    got = load_checkpoint(ckpt, dtype="float32", progress=False)
    assert all(torch.equal(got.params[k], want.params[k]) for k in want.params)


def test_shard_linked_to_a_device_is_refused(ckpt: Path) -> None:
    fname = sorted(set(_index(ckpt).values()))[0]
    (ckpt / fname).unlink()
    (ckpt / fname).symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match=rf"names '{fname}', which resolves to /dev/zero, not a regular file"):
        load_checkpoint(ckpt, progress=False)


def test_non_string_weight_map_entry_is_named(ckpt: Path) -> None:
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = {"path": "x"}
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"names \{'path': 'x'\}, which is not a file name"):
        load_checkpoint(ckpt, progress=False)


def test_hub_cache_layout_with_blob_links_loads(qwen3_ckpt: Path, tmp_path: Path) -> None:
    """The Hugging Face cache links snapshots/REV/* to ../../blobs/*: that is allowed."""
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abcd", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, src in enumerate(sorted(qwen3_ckpt.iterdir())):
        shutil.copy(src, blobs / f"blob{i}")
        (snapshot / src.name).symlink_to(Path("../../blobs") / f"blob{i}")
    a = load_checkpoint(snapshot, dtype="float32", progress=False)
    b = load_checkpoint(qwen3_ckpt, dtype="float32", progress=False)
    assert all(torch.equal(a.params[k], b.params[k]) for k in b.params)
