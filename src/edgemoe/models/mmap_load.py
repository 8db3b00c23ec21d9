"""`--expert-store mmap`: expert tensors registered as views into their checkpoint files
(nothing is read at load time), per expert or a layer's experts stacked."""

from __future__ import annotations

from pathlib import Path

from edgemoe.models.checkpoint_files import CheckpointError, check_plain
from edgemoe.models.names import Placement
from edgemoe.moe.mmap_store import MmapStore


def map_expert(path: Path, name: str, place: Placement, store: MmapStore) -> None:
    """Register a per-expert tensor as a view into its file (nothing is read)."""
    _, layer, which = place.target.split(".")
    expert = place.index[0]
    part = "down" if which == "down" else ("gate" if place.index[1].start == 0 else "up")  # type: ignore[union-attr]
    try:
        view = store.file(path).view(name)
    except (KeyError, ValueError, OSError) as e:
        raise CheckpointError(f"{path}: cannot map tensor {name!r}: corrupt or truncated ({e})") from None
    check_plain(path, name, view)
    want = store.expected_shape(part)
    if tuple(view.shape) != want:
        raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(view.shape)}, expected {want}")
    store.add(int(layer), int(expert), part, view)  # type: ignore[arg-type]


def map_stacked(path: Path, name: str, place: Placement, store: MmapStore) -> None:
    """Register each expert of a stacked [E, 2I, H] / [E, H, I] tensor as a view (nothing is read)."""
    _, layer, which = place.target.split(".")
    experts = range(store.num_experts)[place.index[0]]  # type: ignore[index]
    try:
        view = store.file(path).view(name)
    except (KeyError, ValueError, OSError) as e:
        raise CheckpointError(f"{path}: cannot map tensor {name!r}: corrupt or truncated ({e})") from None
    check_plain(path, name, view)
    part_shape = store.down_shape if which == "down" else store.gate_up_shape
    if tuple(view.shape) != (len(experts), *part_shape):
        raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(view.shape)}, "
                              f"expected {(len(experts), *part_shape)}")
    inter = store.gate_up_shape[0] // 2
    for j, e in enumerate(experts):
        if which == "down":
            store.add(int(layer), e, "down", view[j])
        else:
            store.add(int(layer), e, "gate", view[j, :inter])
            store.add(int(layer), e, "up", view[j, inter:])
