"""A combine reading some cells elsewhere (`kernels/cell_sources.py`): padding rows' pairs
as 0 and the CPU share's pairs from its mailbox rows. The kernels (Triton's interpreter on
CPU) bitwise against the buffer written first (`apply_sources`, the reference) and
combined plainly; the reference against cells built by hand."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from edgemoe.kernels.cell_sources import CellSources, apply_sources
from edgemoe.kernels.moe_reference import moe_combine_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
EPS = 1e-6


def case(T: int, K: int, H: int, seed: int) -> tuple[torch.Tensor, CellSources, torch.Tensor]:
    """(cells with garbage in the pairs the sources name, the sources, the cells they mean)."""
    g = torch.Generator().manual_seed(seed)
    want = torch.randn(T, K, H, generator=g)
    dead = torch.zeros(T, dtype=torch.bool)
    dead[-1] = True  # a padding row
    want[-1] = 0.0
    cap = 2 * K
    cpu_out = torch.randn(cap, H, generator=g)
    cpu_col = torch.full((T * K + 5,), -1, dtype=torch.int32)  # longer than the step: a persistent map
    pairs = [p for p in range(0, (T - 1) * K, 3)][:cap]  # every third live pair on the CPU
    for col, p in enumerate(pairs):
        cpu_col[p] = col
        want.view(T * K, H)[p] = cpu_out[col]
    cells = want.clone()
    cells[-1] = float("nan")  # never written: garbage
    for p in pairs:
        cells.view(T * K, H)[p] = float("inf")  # the device's stale cell, not read
    return cells, CellSources(dead, cpu_col, cpu_out), want


def test_reference_writes_the_sources_cells() -> None:
    cells, sources, want = case(4, 3, 40, seed=1)
    assert torch.equal(apply_sources(cells, sources), want)
    only_dead, _, _ = case(4, 3, 40, seed=1)
    apply_sources(only_dead, CellSources(dead=sources.dead))
    assert bool((only_dead[-1] == 0).all()) and bool(torch.isinf(only_dead).any())  # the CPU's left alone
    assert apply_sources(cells, None) is cells


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("T", "K", "H"), [(3, 4, 96), (2, 8, 64)])
@pytest.mark.parametrize("which", ["both", "dead", "cpu"])
def test_kernels_read_the_sources_bitwise(dtype: torch.dtype, T: int, K: int, H: int, which: str) -> None:
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_norm_triton, moe_combine_triton

    cells, full, want = case(T, K, H, seed=T + K + H)
    sources = {"both": full, "dead": CellSources(dead=full.dead),
               "cpu": CellSources(cpu_col=full.cpu_col, cpu_out=full.cpu_out)}[which]
    if which == "cpu":
        cells[-1] = want[-1]  # no padding rows named: their cells written
    if which == "dead":
        cells = torch.where(torch.isinf(cells), want, cells)  # no CPU pairs named: their cells written
    g = torch.Generator().manual_seed(7)
    residual = (torch.randn(T, H, generator=g) * 2).to(dtype)
    weight = (torch.randn(H, generator=g) * 0.3 + 1).to(dtype)
    expect = apply_sources(cells.clone(), sources)
    if which != "dead":
        assert torch.equal(expect, want)
    got = moe_combine_triton(cells, dtype, residual, sources)
    assert torch.equal(got, moe_combine_triton(expect, dtype, residual))
    assert torch.equal(got, moe_combine_ref(expect, dtype, residual))
    h, normed = moe_combine_norm_triton(cells, dtype, residual, weight, EPS, 0.0, sources)
    want_h, want_normed = moe_combine_norm_triton(expect, dtype, residual, weight, EPS, 0.0)
    assert torch.equal(h, want_h) and torch.equal(normed, want_normed)
    assert torch.isfinite(h).all()  # the garbage was never read
