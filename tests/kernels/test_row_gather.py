"""The row gather (host-resident PLE tables and embeddings): the Triton kernel under the
interpreter on CPU tensors against the reference, bit for bit (it copies rows). Offsets
past 2^31 elements need a table of that size: tests/gpu/test_qwen4_gpu.py gathers from one."""

from __future__ import annotations

import os

import pytest
import torch

from edgemoe.kernels.row_gather import gather_rows, gather_rows_into, gather_rows_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def test_reference_is_index_select_on_cpu() -> None:
    table = torch.randn(50, 7)
    ids = torch.tensor([[3, 49], [0, 3]])
    assert torch.equal(gather_rows(table, ids), table[ids.reshape(-1)])


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D", [1, 64, 300])  # one column block, and two with a ragged one
def test_triton_kernel_copies_the_rows(dtype: torch.dtype, D: int) -> None:
    from edgemoe.kernels.triton_ops.row_gather import gather_rows_triton

    g = torch.Generator().manual_seed(D)
    table = torch.randn(37, D, generator=g).to(dtype)
    ids = torch.randint(0, 37, (19,), generator=g)  # 19: a ragged last row tile of 8
    got = gather_rows_triton(table, ids)
    assert torch.equal(got.view(torch.uint8), gather_rows_ref(table, ids).view(torch.uint8))


def scatter_expected(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """The plain loop: each valid entry's table row lands in its destination row."""
    want = out.clone()
    for i, d in zip(ids.tolist(), dst.tolist(), strict=True):
        if i >= 0:
            want[d] = table[i]
    return want


def test_gather_into_reference_writes_only_the_valid_entries() -> None:
    table, out = torch.randn(9, 5), torch.randn(4, 5)
    ids, dst = torch.tensor([7, -1, 2, -1]), torch.tensor([3, -1, 0, -1])
    want = scatter_expected(table, ids, out, dst)
    gather_rows_into(table, ids, out, dst)
    assert torch.equal(out, want)


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.uint8])  # the movers copy bits as ints
@pytest.mark.parametrize("D", [1, 300, 2500])  # one column block; ragged; several blocks of 1024
def test_triton_gather_into_copies_the_valid_rows(dtype: torch.dtype, D: int) -> None:
    from edgemoe.kernels.triton_ops.row_gather import gather_rows_into_triton

    g = torch.Generator().manual_seed(D)
    table = torch.randint(0, 100, (11, D), generator=g).to(dtype)
    out = torch.randint(0, 100, (6, D), generator=g).to(dtype)
    ids = torch.tensor([4, 10, 0, -1, -1], dtype=torch.int32)  # a -1 padded miss list
    dst = torch.tensor([5, 0, 2, -1, -1], dtype=torch.int32)
    want = scatter_expected(table, ids, out, dst)
    gather_rows_into_triton(table, ids, out, dst)
    assert torch.equal(out, want)


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("programs", [1, 4])
def test_triton_gather_into_shares_a_long_sparse_list(programs: int) -> None:
    """The persistent grid: -1 anywhere in the list, more entries than a chunk (128), rows
    of several column blocks, any number of programs (the round-robin crosses chunks)."""
    from edgemoe.kernels.triton_ops.row_gather import BLOCK_INTO, CHUNK_INTO, gather_rows_into_triton

    g = torch.Generator().manual_seed(programs)
    N, D = CHUNK_INTO + 70, 2 * BLOCK_INTO + 3
    table = torch.randint(0, 1000, (N, D), generator=g, dtype=torch.int32)
    out = torch.randint(0, 1000, (N, D), generator=g, dtype=torch.int32)
    ids = torch.randperm(N, generator=g).to(torch.int32)
    dst = torch.randperm(N, generator=g).to(torch.int32)
    drop = torch.rand(N, generator=g) < 0.9  # a sparse list, a few valid entries in each chunk
    ids[drop], dst[drop] = -1, -1
    want = scatter_expected(table, ids, out, dst)
    gather_rows_into_triton(table, ids, out, dst, programs=programs)
    assert torch.equal(out, want)
    empty = out.clone()
    gather_rows_into_triton(table, torch.full_like(ids, -1), out, dst, programs=programs)
    assert torch.equal(out, empty)  # nothing valid: nothing written


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("programs", [1, 5])
def test_triton_gather_parts_writes_every_part_in_one_launch(programs: int) -> None:
    """An int4 expert's six parts (int32 weights, int16 scales, uint8 zero points, widths from
    one column to several blocks) under one list: each part's rows land as the one-table
    form puts them, with the round-robin running on across parts and chunks."""
    from edgemoe.kernels.triton_ops.row_gather import BLOCK_INTO, CHUNK_INTO, gather_parts_into_triton

    g = torch.Generator().manual_seed(programs)
    N, R = CHUNK_INTO + 9, 40
    widths = [(2 * BLOCK_INTO + 5, torch.int32), (33, torch.int16), (1, torch.uint8),
              (BLOCK_INTO, torch.int32), (300, torch.int16), (7, torch.uint8)]
    tables = [torch.randint(0, 100, (R, d), generator=g).to(dt) for d, dt in widths]
    outs = [torch.randint(0, 100, (N, d), generator=g).to(dt) for d, dt in widths]
    ids = torch.full((N,), -1, dtype=torch.int32)
    dst = torch.full((N,), -1, dtype=torch.int32)
    picks = torch.randperm(N, generator=g)[:12]  # a sparse list: entries in both chunks
    ids[picks] = torch.randint(0, R, (12,), generator=g, dtype=torch.int32)
    dst[picks] = torch.randperm(N, generator=g)[:12].to(torch.int32)
    want = [scatter_expected(t, ids, o, dst) for t, o in zip(tables, outs, strict=True)]
    gather_parts_into_triton(tables, ids, outs, dst, programs=programs)
    for part, (got, expected) in enumerate(zip(outs, want, strict=True)):
        assert torch.equal(got, expected), part


def test_gather_parts_reference_writes_every_table() -> None:
    """Off CUDA the parts form is the reference, table by table (ten: more than a launch holds)."""
    from edgemoe.kernels.row_gather import gather_parts_into

    g = torch.Generator().manual_seed(3)
    tables = [torch.randn(9, 4 + k, generator=g) for k in range(10)]
    outs = [torch.randn(5, 4 + k, generator=g) for k in range(10)]
    ids, dst = torch.tensor([8, -1, 0, 4]), torch.tensor([1, -1, 4, 0])
    want = [scatter_expected(t, ids, o, dst) for t, o in zip(tables, outs, strict=True)]
    gather_parts_into(tables, ids, outs, dst)
    assert all(torch.equal(o, w) for o, w in zip(outs, want, strict=True))


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
def test_gather_parts_refuses_more_parts_than_a_launch_holds() -> None:
    from edgemoe.kernels.triton_ops.row_gather import MAX_PARTS, gather_parts_into_triton

    t = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="1..8"):
        gather_parts_into_triton([t] * (MAX_PARTS + 1), torch.zeros(1, dtype=torch.int32), [t] * (MAX_PARTS + 1),
                                 torch.zeros(1, dtype=torch.int32))
