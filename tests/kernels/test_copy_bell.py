"""The copier (kernels/copy_bell.py, kernels/cpu/em_copier.h) driven from the host: the C
thread reads the rung rows and copies each miss's parts from the store's banks into its
slots with the library's host stand-ins for the driver (a memcpy and a store), exactly as it
issues `cuMemcpyHtoDAsync` on a GPU. Several rows rung before any wait, padding (-1) entries,
store layers that don't start at 0, a bad entry refused (answered, nothing copied, the error
raised); the Triton ring under the interpreter against its torch reference."""

from __future__ import annotations

import os

import pytest
import torch

from edgemoe.kernels.copy_bell import HEADER, CopyBell, copier_library, publish_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
E, S, H, I = 12, 7, 16, 6  # noqa: E741 - the expert shape's names


def _store(layers: list[int]) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [{"gate_up": torch.randn(E, 2 * I, H, generator=g).bfloat16(),
             "down": torch.randn(E, H, I, generator=g).bfloat16(),
             "down_scale": torch.randint(0, 255, (E, 3), generator=g, dtype=torch.uint8)} for _ in layers]


def _slots() -> dict[str, torch.Tensor]:
    return {"gate_up": torch.zeros(S, 2 * I, H, dtype=torch.bfloat16), "down": torch.zeros(S, H, I, dtype=torch.bfloat16),
            "down_scale": torch.zeros(S, 3, dtype=torch.uint8)}


@pytest.fixture
def lib():
    library = copier_library()
    if library is None:
        pytest.skip("no C compiler: no copier")
    return library


def _misses(pairs: list[tuple[int, int]], width: int) -> torch.Tensor:
    out = torch.full((2, width), -1, dtype=torch.int32)
    for i, (e, s) in enumerate(pairs):
        out[0, i], out[1, i] = e, s
    return out


def test_rows_rung_before_their_waits_land_every_part(lib) -> None:  # noqa: ANN001
    layers = [3, 5, 9]
    store, slots = _store(layers), _slots()
    bell = CopyBell(lib, layers, store, slots, rows=3, width=4, device=None)
    try:
        asks = [(0, 5, [(2, 0), (11, 6)]), (1, 9, [(0, 1)]), (2, 3, [(7, 2), (2, 3), (4, 4)])]
        for row, layer, pairs in asks:
            bell.ring(row, layer, _misses(pairs, 3)[:, :len(pairs) + 1])  # a -1 entry inside the list
        for row, layer, pairs in asks:
            bell.wait(row)
            for e, s in pairs:
                for name, bank in slots.items():
                    assert torch.equal(bank[s], store[layers.index(layer)][name][e]), (layer, e, s, name)
        assert not slots["gate_up"][5].any()  # a slot nobody asked for
        bell.drain()
        stats = bell.stats()
        assert stats["rings"] == 3 and stats["copies"] == 6 * 3 and stats["errors"] == 0
        assert stats["bytes"] == 6 * sum(b[0].nbytes for b in slots.values())
    finally:
        bell.close()


def test_a_row_reused_after_its_wait(lib) -> None:  # noqa: ANN001
    store, slots = _store([0]), _slots()
    bell = CopyBell(lib, [0], store, slots, rows=1, width=2, device=None)
    try:
        for step, (e, s) in enumerate([(1, 2), (3, 2), (4, 0)]):
            bell.ring(0, 0, _misses([(e, s)], 2))
            bell.wait(0)
            assert torch.equal(slots["down"][s], store[0]["down"][e]), step
    finally:
        bell.close()


def test_the_host_view_reads_the_thread_without_the_device(lib) -> None:  # noqa: ANN001
    store, slots = _store([0, 4]), _slots()
    bell = CopyBell(lib, [0, 4], store, slots, rows=2, width=3, device=None)
    try:
        bell.ring(1, 4, _misses([(6, 1), (2, 0)], 3))
        bell.wait(1)
        view = bell.host_view()
        assert view["flags"] == [0, 0] and view["inside_a_ring"] is False  # taken, answered
        assert view["rows"][1] == [1, 0, 6, 2, -1, 1]  # table layer 1 (store layer 4), ids, then slots
        assert view["copier"]["rings"] == 1 and view["copier"]["copies"] == 2 * len(slots)
    finally:
        bell.close()
    assert bell.host_view()["inside_a_ring"] is None  # closed: nothing to ask


@pytest.mark.parametrize("bad", [(E, 1), (-2, 1), (1, S), (1, -1)])
def test_a_bad_entry_is_answered_copied_nowhere_and_raised(lib, bad) -> None:  # noqa: ANN001
    store, slots = _store([0]), _slots()
    bell = CopyBell(lib, [0], store, slots, rows=1, width=2, device=None)
    try:
        bell.ring(0, 0, _misses([bad], 2))
        if bad[0] == -2:  # a negative id is padding, whatever its slot: nothing to copy
            bell.wait(0)
            bell.drain()
            return
        bell.wait(0)  # answered: a device waiting on it would otherwise hang
        assert all(not bank.any() for bank in slots.values())
        with pytest.raises(RuntimeError, match="copier: 1 rows failed"):
            bell.drain()
    finally:
        bell.close()


def test_publish_ref_row_layout() -> None:
    row, flag, done = torch.full((HEADER + 8,), 9, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), \
        torch.ones(1, dtype=torch.int32)
    publish_ref(torch.tensor([[4, -1, 2], [0, -1, 1]], dtype=torch.int32), 6, row, flag, done)
    assert row.tolist() == [6, 0, 4, -1, 2, -1, 0, -1, 1, -1] and flag.item() == 1 and done.item() == 0


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("width,m", [(1, 1), (5, 3), (8, 8), (12, 0)])
def test_the_ring_launch_matches_the_reference(width: int, m: int) -> None:
    from edgemoe.kernels.triton_ops.copy_ring import publish_triton

    g = torch.Generator().manual_seed(width * 10 + m)
    wide = torch.randint(-1, 50, (2, width + 3), generator=g, dtype=torch.int32)
    misses = wide[:, :m]  # a view with the buffer's row stride, as the prefetch's
    outs = []
    for fn in (publish_ref, publish_triton):
        row, flag = torch.full((HEADER + 2 * width,), 7, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        done = torch.ones(1, dtype=torch.int32)
        fn(misses, 4, row, flag, done)
        outs.append((row, flag, done))
    for ref, tri in zip(*outs, strict=True):
        assert torch.equal(ref, tri)
