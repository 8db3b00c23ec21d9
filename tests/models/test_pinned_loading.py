"""A pinned checkpoint load: banks allocated pageable at their exact size, each
page-locked in place (a fake registrar here; tests/gpu for cudaHostRegister) as soon as
its last expert tensor is written, while later shards are still being read."""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open as real_safe_open

from edgemoe.models import loader
from edgemoe.models.loader import CheckpointError, load_checkpoint
from edgemoe.moe.pinning import InPlacePinner, PinWhenFilled


class RecordingRegistrar:
    """Records each registration with a copy of the bytes it locked (read from the
    address, as the driver would see them) and the thread that did it."""

    def __init__(self) -> None:
        self.registered: list[tuple[int, int, bytes]] = []
        self.unregistered: list[int] = []
        self.threads: set[str] = set()

    def register(self, ptr: int, nbytes: int) -> None:
        self.threads.add(threading.current_thread().name)
        self.registered.append((ptr, nbytes, ctypes.string_at(ptr, nbytes)))

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)


@pytest.fixture(scope="module")
def sharded(make_ckpt) -> Path:  # noqa: ANN001
    # Shards of ~64 KiB: each layer's experts end in an early shard, so a bank that is
    # pinned "as it completes" is pinned before the last shards are opened.
    return make_ckpt("qwen3_moe", max_shard_bytes=64 * 1024)


def test_pin_when_filled_submits_on_the_last_piece() -> None:
    submitted: list[torch.Tensor] = []

    class Pinner:
        def submit(self, t: torch.Tensor) -> None:
            submitted.append(t)

    a, b = torch.zeros(4), torch.zeros(2)
    tracker = PinWhenFilled(Pinner(), {"a": (a, {"a0", "a1", "a2"}), "b": (b, {"b0"})})  # type: ignore[arg-type]
    for name, piece in [("a", "a0"), ("a", "a0"), ("b", "b0"), ("a", "a1"), ("x", "x0")]:
        tracker.filled(name, piece)  # a duplicate piece and an unknown tensor count for nothing
    assert submitted == [b] and tracker.pending == ["a"]
    tracker.filled("a", "a2")
    assert [t is a for t in submitted] == [False, True] and tracker.pending == []


def test_banks_pinned_in_place_as_each_completes(sharded: Path, monkeypatch) -> None:  # noqa: ANN001
    events: list[tuple[str, object]] = []
    monkeypatch.setattr(loader, "safe_open", lambda path, **kw: (events.append(("open", path)), real_safe_open(path, **kw))[1])
    submit = InPlacePinner.submit
    monkeypatch.setattr(InPlacePinner, "submit", lambda self, t: (events.append(("submit", t.data_ptr())), submit(self, t))[1])
    fake = RecordingRegistrar()
    loaded = load_checkpoint(sharded, progress=False, expert_store="pinned", registrar=fake)
    store, ram = loaded.experts, load_checkpoint(sharded, progress=False).experts
    banks = [(layer, which) for layer in store.layers for which in ("gate_up", "down")]
    assert store.pinned and fake.threads == {"edgemoe-pin"}
    # exactly the banks, at their exact size (a pinned allocation would round up), each
    # complete when it was locked: its bytes then are the finished bank's
    spans = {(store.tensor(l, w).data_ptr(), store.tensor(l, w).nbytes): (l, w) for l, w in banks}
    assert sorted((p, n) for p, n, _ in fake.registered) == sorted(spans)
    for ptr, nbytes, seen in fake.registered:
        layer, which = spans[(ptr, nbytes)]
        expected = ram.tensor(layer, which)
        assert seen == ctypes.string_at(expected.data_ptr(), expected.nbytes)
        assert torch.equal(store.tensor(layer, which), expected)
    # overlapped with reading: the first bank went to the pinner before the last shard was opened
    opens = [i for i, (kind, _) in enumerate(events) if kind == "open"]
    first_submit = next(i for i, (kind, _) in enumerate(events) if kind == "submit")
    assert len(opens) >= 4 and first_submit < opens[-1]
    store.close()
    assert sorted(fake.unregistered) == sorted(p for p, _ in spans)


def test_failed_load_unpins_what_it_pinned(sharded: Path, tmp_path: Path) -> None:
    import shutil

    ckpt = Path(shutil.copytree(sharded, tmp_path / "ckpt"))
    last = list(loader.safetensors_files(ckpt))[-1]  # the shard the loader reads last
    (ckpt / last).write_bytes(b"\x00" * 16)  # truncated
    fake = RecordingRegistrar()
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(ckpt, progress=False, expert_store="pinned", registrar=fake)
    assert fake.registered and sorted(fake.unregistered) == sorted(p for p, _, _ in fake.registered)


def test_pinned_without_a_registrar_stays_pageable(sharded: Path, caplog) -> None:  # noqa: ANN001
    with caplog.at_level(logging.WARNING, logger="edgemoe.models.loader"):
        store = load_checkpoint(sharded, progress=False, expert_store="pinned").experts
    assert not store.pinned and "pageable" in caplog.text
