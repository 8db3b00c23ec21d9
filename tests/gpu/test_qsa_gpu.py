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
    assert torch.equal(valid.sum(1), want_valid.sum(1))  # the fast path's top-k is unsorted: sets, not orders
    assert torch.equal(valid, blocks < visible[:, None])
    for i in range(2):  # the same set, unless the k-th and (k+1)-th scores are within the sums' error
        kth = want[i].topk(TOPK + 1).values
        if (kth[-2] - kth[-1]).abs() > 1e-3 * kth[-2].abs():
            assert set(blocks[i][valid[i]].tolist()) == set(want_blocks[i][want_valid[i]].tolist())


def test_decode_attention_over_the_selection_at_the_preset_shape() -> None:
    """`attend_selected_decode` (the split-K paged kernel over the selection's page table)
    against `attend_selected` (16 query / 2 kv heads of 256, top 512 blocks of 4), queries with
    tails of 0-3 tokens, one at the page table's last position. The reference rounds each
    score and probability to bf16, the kernel keeps them fp32: a score off by Δ moves its
    probability by a factor within exp(±2Δ)."""
    from edgemoe.kernels.qsa import attend_selected, attend_selected_decode

    g = torch.Generator(device=CUDA).manual_seed(1)
    pages, n = BLOCKS * RATIO // PAGE, 4
    page_table = torch.randperm(n * pages, generator=g, device=CUDA).view(n, pages).to(torch.int32)
    slots = n * pages * PAGE
    index_k = torch.randn(slots, 128, generator=g, device=CUDA).to(BF16)
    k_cache = torch.randn(slots, 2, 256, generator=g, device=CUDA).to(BF16)
    v_cache = torch.randn(slots, 2, 256, generator=g, device=CUDA).to(BF16)
    q = (torch.randn(n, 16, 256, generator=g, device=CUDA) * 0.25).to(BF16)  # scores of a few units
    qi = torch.randn(n, 16, 128, generator=g, device=CUDA).to(BF16)
    rows = torch.tensor([2, 0, 3, 1], device=CUDA)
    positions = torch.tensor([6, 5001, 70002, BLOCKS * RATIO - 1], device=CUDA)  # tails 3, 2, 3, 0
    blocks, valid = select_decode_blocks(qi, index_k, page_table, rows, (positions + 1) // RATIO, BLOCKS, PAGE,
                                         RATIO, TOPK)
    scale = 256**-0.5
    got = attend_selected_decode(q, positions, rows, blocks, valid, k_cache, v_cache, page_table, PAGE, RATIO, scale)
    want = attend_selected(q, positions, rows, blocks, valid, k_cache, v_cache, page_table, PAGE, RATIO, scale)
    bf16_eps = torch.finfo(BF16).eps
    max_qk = max(float(torch.einsum("nhd,sd->nhs", q.float(), k_cache[:, kv].float()).abs().amax()) for kv in (0, 1))
    score_err = bf16_eps / 2 * max_qk * scale  # the reference's bf16 score: one rounding of q·k (scale: 2^-4, exact)
    tol = (torch.exp(torch.tensor(2 * score_err)) - 1 + bf16_eps) * v_cache.float().abs().amax() + \
        bf16_eps * want.float().abs()
    assert ((got.float() - want.float()).abs() <= tol).all(), f"max |diff| {(got.float() - want.float()).abs().max()}"
