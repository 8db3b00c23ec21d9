"""The row gather (host-resident PLE tables and embeddings): the Triton kernel under the
interpreter on CPU tensors against the reference, bit for bit (it copies rows). Offsets
past 2^31 elements need a table of that size: tests/gpu/test_qwen4_gpu.py gathers from one."""

from __future__ import annotations

import os

import pytest
import torch

from edgemoe.kernels.row_gather import gather_rows, gather_rows_ref

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
