"""QSA's decode block scorer compiled, on the GPU, at the preset's shape (16 indexer heads ×
128, 32K blocks of 4 tokens: a 128K-token page table) against the torch reference, and the
blocks it selects against `select_blocks` over the gathered keys wherever the scores aren't
near a tie."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgemoe.kernels.qsa import block_keys, decode_block_scores_ref, select_blocks, select_decode_blocks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
CUDA, BF16 = torch.device("cuda"), torch.bfloat16
PAGE, RATIO, BLOCKS, TOPK = 64, 4, 32768, 512


def test_block_scores_and_selection_at_the_preset_shape() -> None:
    g = torch.Generator(device=CUDA).manual_seed(0)
    pages = BLOCKS * RATIO // PAGE
    page_table = torch.randperm(2 * pages, generator=g, device=CUDA)[: 2 * pages].view(2, pages).to(torch.int32)
    index_k = torch.randn(2 * pages * PAGE, 128, generator=g, device=CUDA).to(BF16)
    qi = torch.randn(2, 16, 128, generator=g, device=CUDA).to(BF16)
    rows, visible = torch.tensor([1, 0], device=CUDA), torch.tensor([BLOCKS, 9000], device=CUDA)
    from edgemoe.kernels.triton_ops.qsa import block_scores_triton

    got = block_scores_triton(qi, index_k, page_table, rows, visible, BLOCKS, PAGE, RATIO)
    want = decode_block_scores_ref(qi, index_k, page_table, rows, visible, BLOCKS, PAGE, RATIO)
    keys = block_keys(index_k, page_table, rows, BLOCKS, PAGE, RATIO).float()
    mag = torch.einsum("nhd,nbd->nb", qi.float().abs(), keys.abs()) / 128**0.5
    assert torch.equal(got < 0, want < 0)
    assert ((got - want).abs() <= 128 * torch.finfo(torch.float32).eps * mag + 1e-30).all()
    blocks, valid = select_decode_blocks(qi, index_k, page_table, rows, visible, BLOCKS, PAGE, RATIO, TOPK)
    want_blocks, want_valid = select_blocks(qi, block_keys(index_k, page_table, rows, BLOCKS, PAGE, RATIO), visible,
                                            TOPK)
    assert torch.equal(valid, want_valid)
    for i in range(2):  # the same set, unless the k-th and (k+1)-th scores are within the sums' error
        kth = want[i].topk(TOPK + 1).values
        if (kth[-2] - kth[-1]).abs() > 1e-3 * kth[-2].abs():
            assert set(blocks[i].tolist()) == set(want_blocks[i].tolist())
