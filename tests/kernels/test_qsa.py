"""QSA's decode block selection: the scores' reference against `select_blocks` over the
gathered keys, and the Triton scorer (interpreter on CPU) against that reference, with
keys scattered over pages, several requests and unseen blocks."""

from __future__ import annotations

import os

import pytest
import torch

from edgemoe.kernels.qsa import (
    attend_selected,
    attend_selected_decode,
    block_keys,
    decode_block_scores_ref,
    select_blocks,
    select_decode_blocks,
    top_blocks,
)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PAGE, RATIO = 8, 4


def paged(n: int, blocks: int, di: int, dtype: torch.dtype, seed: int):  # noqa: ANN201
    """(qi [n, Hi, Di], index_k [S, Di], page_table, rows, visible): request i's pages a
    shuffled subset of the pool; visible blocks from 0 to all."""
    g = torch.Generator().manual_seed(seed)
    pages_per_req = blocks * RATIO // PAGE
    perm = torch.randperm(n * pages_per_req + 3, generator=g)[: n * pages_per_req]
    page_table = perm.view(n, pages_per_req).to(torch.int32)
    index_k = torch.randn((n * pages_per_req + 3) * PAGE, di, generator=g).to(dtype)
    qi = torch.randn(n, 6, di, generator=g).to(dtype)
    rows = torch.arange(n - 1, -1, -1)
    visible = torch.linspace(0, blocks, n).long()
    return qi, index_k, page_table, rows, visible


def test_reference_scores_select_as_select_blocks() -> None:
    qi, index_k, pt, rows, visible = paged(3, 40, 32, torch.float32, 0)
    scores = decode_block_scores_ref(qi, index_k, pt, rows, visible, 40, PAGE, RATIO)
    want = select_blocks(qi, block_keys(index_k, pt, rows, 40, PAGE, RATIO), visible, 16)
    got = top_blocks(scores, visible, 16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # on a CPU the dispatcher is select_blocks itself
    got = select_decode_blocks(qi, index_k, pt, rows, visible, 40, PAGE, RATIO, 16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("blocks", [40, 130])  # 130: a partial last program
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_scores_match_reference(blocks: int, dtype: torch.dtype) -> None:
    from edgemoe.kernels.triton_ops.qsa import block_scores_triton

    qi, index_k, pt, rows, visible = paged(3, blocks, 64, dtype, blocks)
    got = block_scores_triton(qi, index_k, pt, rows, visible, blocks, PAGE, RATIO)
    want = decode_block_scores_ref(qi, index_k, pt, rows, visible, blocks, PAGE, RATIO)
    assert torch.equal(got < 0, want < 0) and (got[want < 0] == -1).all()
    # fp32 sums of exact products in another order: within Di ulps of the sum of |products|
    keys = block_keys(index_k, pt, rows, blocks, PAGE, RATIO).float()
    mag = torch.einsum("nhd,nbd->nb", qi.float().abs(), keys.abs()) / 8.0
    assert ((got - want).abs() <= 64 * torch.finfo(torch.float32).eps * mag + 1e-30).all()


def kv_pool(slots: int, hkv: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(slots, hkv, d, generator=g).to(dtype), torch.randn(slots, hkv, d, generator=g).to(dtype)


def shuffled_pages(n: int, blocks_cap: int, page: int, spare: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """(page table [n, blocks_cap·RATIO / page] int32 of shuffled pages, the pool's slots with
    `spare` pages nobody holds)."""
    pages = n * blocks_cap * RATIO // page
    return torch.randperm(pages + spare, generator=g)[:pages].view(n, -1).to(torch.int32), (pages + spare) * page


def random_selection(positions: torch.Tensor, blocks_cap: int, topk: int,
                     g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(blocks, valid, visible): each query's top-k of random scores over the blocks it sees,
    unsorted as the fast path's top-k."""
    visible = (positions + 1) // RATIO
    scores = torch.rand(len(positions), blocks_cap, generator=g)
    scores = torch.where(torch.arange(blocks_cap)[None, :] < visible[:, None], scores, -1.0)
    blocks, valid = top_blocks(scores, visible, topk, ordered=False)
    return blocks, valid, visible


@pytest.mark.parametrize("page", [4, 8, 16])
def test_selected_page_table_attends_to_attend_selected_tokens(page: int) -> None:
    """The paged decode reference over `selected_page_table_ref` (what the GPU path hands the
    split-K kernel) against `attend_selected`, in fp32: blocks in any order, queries with 0-3
    tail tokens, fewer visible blocks than k and more, one at the page table's last position."""
    from edgemoe.kernels.paged_attention import decode_attention_ref
    from edgemoe.kernels.qsa import selected_page_table_ref

    blocks_cap, topk, n = 48, 6, 7
    capacity = blocks_cap * RATIO
    g = torch.Generator().manual_seed(page)
    pt, slots = shuffled_pages(n, blocks_cap, page, 5, g)
    rows = torch.arange(n - 1, -1, -1)
    positions = torch.tensor([0, 2, 3, 13, 30, 101, capacity - 1])  # tails 1, 3, 0, 2, 3, 2, 0
    visible = (positions + 1) // RATIO
    qi, keys = torch.randn(n, 3, 32, generator=g), torch.randn(slots, 32, generator=g)
    blocks, valid = select_blocks(qi, block_keys(keys, pt, rows, blocks_cap, page, RATIO), visible, topk)
    k_cache, v_cache = kv_pool(slots, 2, 16, torch.float32, 4)
    q = torch.randn(n, 4, 16, generator=torch.Generator().manual_seed(5))
    want = attend_selected(q, positions, rows, blocks, valid, k_cache, v_cache, pt, page, RATIO, 0.25)
    shuffled = blocks.gather(1, torch.randperm(topk, generator=g).expand(n, -1))  # the fast path's top-k is unsorted
    table, lengths = selected_page_table_ref(positions, rows, shuffled, pt, page, RATIO)
    assert lengths.tolist() == [min(int(v), topk) * RATIO + int(p) + 1 - int(v) * RATIO
                                for p, v in zip(positions, visible, strict=True)]
    got = decode_attention_ref(q, k_cache, v_cache, table, torch.arange(n, dtype=torch.int32), lengths, RATIO, 0.25,
                               None, torch.empty_like(q))
    # The same tokens in another order: fp32 sums over <= 27 terms, each |p·v| <= max |v|.
    assert ((got - want).abs() <= 64 * torch.finfo(torch.float32).eps * v_cache.abs().amax()).all()
    # On a CPU the dispatcher is the reference itself.
    same = attend_selected_decode(q, positions, rows, blocks, valid, k_cache, v_cache, pt, page, RATIO, 0.25)
    assert torch.equal(same, want)


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
@pytest.mark.parametrize("topk", [6, 48])  # 48: every block of the table, a partial power-of-two block
def test_triton_selected_page_table_matches_reference(topk: int) -> None:
    from edgemoe.kernels.qsa import selected_page_table_ref
    from edgemoe.kernels.triton_ops.qsa import selected_page_table_triton

    n, blocks_cap, page = 5, 48, 16
    g = torch.Generator().manual_seed(topk)
    pt, _ = shuffled_pages(n, blocks_cap, page, 3, g)
    positions = torch.tensor([1, 4, 27, 150, blocks_cap * RATIO - 1])
    blocks, _, visible = random_selection(positions, blocks_cap, topk, g)
    rows = torch.tensor([4, 2, 0, 1, 3])
    got, got_len = selected_page_table_triton(positions, rows, blocks, pt, page, RATIO)
    want, want_len = selected_page_table_ref(positions, rows, blocks, pt, page, RATIO)
    assert torch.equal(got_len, want_len)
    for i in range(n):  # the written columns: the valid blocks, then the tail's page
        used = int(min(int(visible[i]), topk)) + 1
        assert torch.equal(got[i, :used], want[i, :used])


@pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")
def test_fast_decode_path_attends_as_attend_selected() -> None:
    """The GPU path end to end under the interpreter (the table kernel, then the split-K
    paged decode kernel with 4-token pages) against `attend_selected` in fp32: bf16 rounds
    each probability (<= 2^-9 relative: <= 2^-9 max|v| on the sum) and the output (<= 2^-9
    |out|); bound 2^-7 max|v|."""
    from edgemoe.kernels.triton_ops.attn_decode import decode_attention_triton
    from edgemoe.kernels.triton_ops.qsa import selected_page_table_triton

    n, blocks_cap, page, topk = 4, 40, 16, 8
    g = torch.Generator().manual_seed(7)
    pt, slots = shuffled_pages(n, blocks_cap, page, 2, g)
    rows, positions = torch.tensor([1, 3, 0, 2]), torch.tensor([2, 17, 90, blocks_cap * RATIO - 1])
    blocks, valid, _ = random_selection(positions, blocks_cap, topk, g)
    k_cache, v_cache = kv_pool(slots, 2, 32, torch.bfloat16, 8)
    q = torch.randn(n, 4, 32, generator=g).to(torch.bfloat16)
    table, lengths = selected_page_table_triton(positions, rows, blocks, pt, page, RATIO)
    got = decode_attention_triton(q, k_cache, v_cache, table, torch.arange(n, dtype=torch.int32), lengths, RATIO,
                                  32**-0.5, None, torch.empty_like(q))
    want = attend_selected(q.float(), positions, rows, blocks, valid, k_cache.float(), v_cache.float(), pt, page,
                           RATIO, 32**-0.5)
    assert ((got.float() - want).abs() <= 2**-7 * v_cache.float().abs().amax()).all()
