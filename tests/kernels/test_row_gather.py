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
